"""`make audit`: pip-audit over every install set uv.lock holds, saying plainly when its advisory source did not answer.

pip-audit reports a package its source cannot look up as skipped and still exits 0 ("No known vulnerabilities found"),
so a source that cannot be reached would read as a clean audit: this wrapper counts what was really audited.
Exit status: 0 nothing known, 1 vulnerabilities found, 2 the audit could not run (source unreachable, nothing audited).
Not part of `make test`: it needs the advisory source's network and its answer changes over time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PIP_AUDIT = "pip-audit==2.10.1"
UV = [sys.executable, "-m", "uv"]
# The worker and vllm extras conflict (pyproject [tool.uv]): each resolution is exported and audited on its own.
INSTALL_SETS = {
    "dev, worker, bench": ["--extra", "dev", "--extra", "worker", "--extra", "bench"],
    "vllm": ["--extra", "vllm"],
}
UNREACHABLE, VULNERABLE, CLEAN = 2, 1, 0


def verdict(report_text: str, stderr: str) -> tuple[int, list[str]]:
    """Exit status and lines to print, from pip-audit's JSON report (empty when it failed) and its stderr."""
    try:
        dependencies = json.loads(report_text)["dependencies"]
    except (ValueError, KeyError):
        last = stderr.strip().splitlines()[-1:] or ["no output"]
        return UNREACHABLE, [f"the audit could not run; the advisory source may be unreachable: {last[0]}"]
    skipped = [d for d in dependencies if d.get("skip_reason")]
    audited = len(dependencies) - len(skipped)
    if not audited:
        return UNREACHABLE, [
            f"the advisory source answered for none of {len(dependencies)} packages: nothing was audited"
        ]
    lines = [f"audited {audited} of {len(dependencies)} packages"]
    lines += [f"  not audited: {d['name']} {d.get('version', '')}: {d['skip_reason']}" for d in skipped]
    found = [(d, v) for d in dependencies for v in d.get("vulns", [])]
    for dependency, vuln in found:
        ids = ", ".join([vuln["id"], *vuln.get("aliases", [])])
        fixed = ", ".join(vuln.get("fix_versions", [])) or "no fix yet"
        lines.append(f"  VULNERABLE {dependency['name']} {dependency['version']}: {ids} (fixed in {fixed})")
    return (VULNERABLE if found else CLEAN), lines


def audit(extras: list[str], source: str) -> tuple[int, list[str]]:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        export = [*UV, "export", "--frozen", "--no-emit-project", "--no-hashes", "--quiet", *extras]
        subprocess.run([*export, "-o", requirements.name], check=True, env=env)
        command = [*UV, "tool", "run", "--from", PIP_AUDIT, "pip-audit", "-r", requirements.name, "--no-deps"]
        command += ["--disable-pip", "-s", source, "-f", "json", "--progress-spinner", "off"]
        result = subprocess.run(command, capture_output=True, text=True, env=env)
    return verdict(result.stdout, result.stderr)


def main() -> int:
    source = sys.argv[1] if len(sys.argv) > 1 else "pypi"
    os.chdir(Path(__file__).resolve().parent.parent)
    worst = CLEAN
    for name, extras in INSTALL_SETS.items():
        status, lines = audit(extras, source)
        print(f"[{name}] advisory source {source}: " + "\n".join(lines))
        worst = max(worst, status)
    return worst


if __name__ == "__main__":
    sys.exit(main())

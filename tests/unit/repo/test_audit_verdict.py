"""deps/audit.py reads pip-audit's report: a source that answered for nothing is never a clean audit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("llmq_deps_audit", ROOT / "deps" / "audit.py")
audit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(audit)

SKIPPED = {"name": "h11", "version": "0.16.0", "skip_reason": "Dependency not found on PyPI and could not be audited"}


def report(*dependencies: dict) -> str:
    return json.dumps({"dependencies": list(dependencies), "fixes": []})


def test_a_crash_reaching_the_source_says_so():
    status, lines = audit.verdict("", "Traceback ...\nrequests.exceptions.ConnectionError: name not resolved\n")
    assert status == audit.UNREACHABLE
    assert lines == [
        "the audit could not run; the advisory source may be unreachable: "
        "requests.exceptions.ConnectionError: name not resolved"
    ]


def test_every_package_skipped_is_not_a_clean_audit():
    status, lines = audit.verdict(report(SKIPPED, {**SKIPPED, "name": "idna"}), "")
    assert status == audit.UNREACHABLE
    assert lines == ["the advisory source answered for none of 2 packages: nothing was audited"]


def test_a_vulnerability_is_named_with_its_fix():
    vuln = {"id": "GHSA-vqfr-h8mv-ghfj", "aliases": ["CVE-2025-43859"], "fix_versions": ["0.16.0"]}
    status, lines = audit.verdict(report({"name": "h11", "version": "0.14.0", "vulns": [vuln]}, SKIPPED), "")
    assert status == audit.VULNERABLE
    assert lines[0] == "audited 1 of 2 packages"
    assert lines[-1] == "  VULNERABLE h11 0.14.0: GHSA-vqfr-h8mv-ghfj, CVE-2025-43859 (fixed in 0.16.0)"


def test_nothing_known_is_clean():
    assert audit.verdict(report({"name": "h11", "version": "0.16.0", "vulns": []}), "") == (
        audit.CLEAN,
        ["audited 1 of 1 packages"],
    )

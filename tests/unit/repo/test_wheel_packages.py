"""What the wheel installs, as setuptools discovers it from pyproject's ``[tool.setuptools.packages.find]`` (the same
discovery ``pip install .`` runs, without building): the ``llmq_*`` packages, among them the batch-job library and the
benchmark code ``llmq`` runs, and no top-level ``bench`` (the checkout's scripts and results stay out of it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# In a child process: importing setuptools here would patch distutils under the rest of the suite.
DISCOVER = """
import json, sys, tomllib
from setuptools import find_packages
find = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["packages"]["find"]
packages = [
    package
    for where in find.get("where", ["."])
    for package in find_packages(where, include=find.get("include", ["*"]), exclude=find.get("exclude", ()))
]
json.dump(packages, sys.stdout)
"""


def wheel_packages() -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", DISCOVER], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(result.stdout))


def test_the_wheel_installs_the_llmq_packages_and_no_bench():
    packages = wheel_packages()
    tops = {p.split(".")[0] for p in packages}
    assert tops == {
        "llmq_core",
        "llmq_jobs",
        "llmq_api",
        "llmq_batcher",
        "llmq_worker",
        "llmq_result_router",
        "llmq_bench",
        "llmq_cli",
    }
    assert "bench" not in tops and "tests" not in tops
    assert {"llmq_jobs.store", "llmq_api.batch_jobs", "llmq_cli.batchrun"} <= packages  # subpackages come along


def test_every_package_the_cli_imports_is_in_the_wheel():
    """Each llmq_* module imported anywhere under cli/ (``llmq``'s own code and the benchmark code it runs) is one the
    wheel installs, so every ``llmq`` command works from an installed wheel, not only from the checkout."""
    packages = wheel_packages()
    imported = set()
    for path in (ROOT / "cli").rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("from", "import") and words[1].startswith(("llmq_", "bench")):
                imported.add(words[1].split(".")[0])
    assert imported and not imported - {p.split(".")[0] for p in packages}, imported

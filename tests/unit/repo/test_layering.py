"""The import layering of pyproject's ``[tool.importlinter]`` holds on the tree, and breaks on a planted violation."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]


def lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_tree_keeps_its_layers():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def planted_tree(tmp_path: Path, importer: str, imported: str) -> Path:
    """A stub of every layered package, with pyproject's contracts, where ``importer`` imports ``imported``."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / importer / "planted.py").write_text(f"def late():\n    import {imported}.anything  # noqa\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return tmp_path


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("llmq_core", "llmq_api"),  # llmq_core imports no other llmq package
        ("llmq_worker", "llmq_batcher"),  # a service imports only llmq_core and itself
        ("llmq_api", "llmq_cli"),
        ("llmq_bench", "llmq_cli"),  # the cycle cli <-> bench, gone
        ("llmq_api", "llmq_bench"),  # the services never import benchmark code
        ("llmq_jobs", "llmq_api"),  # the batch-job library sits below the services
        ("llmq_core", "llmq_jobs"),  # ... and above llmq_core
        ("llmq_batcher", "llmq_jobs"),  # the batcher and the worker never see a job (contract "jobs")
        ("llmq_worker", "llmq_jobs"),
    ],
)
def test_a_planted_violation_breaks_the_contract(tmp_path, importer, imported):
    tree = planted_tree(tmp_path, importer, imported)
    result = lint_imports(tree, env={**os.environ, "PYTHONPATH": str(tree)})
    assert result.returncode != 0, result.stdout
    assert f"{importer}.planted -> {imported}" in result.stdout


def test_a_stub_tree_without_the_plant_passes(tmp_path):
    """The planted tests fail because of the plant, not because the stub tree is unreadable."""
    tree = planted_tree(tmp_path, "llmq_api", "llmq_core")
    result = lint_imports(tree, env={**os.environ, "PYTHONPATH": str(tree)})
    assert result.returncode == 0, result.stdout + result.stderr

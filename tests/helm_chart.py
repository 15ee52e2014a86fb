"""The Helm chart's renderer for tests: the pinned helm that `make helm` builds, and `helm template` of deploy/helm/llmq
for the pinned Kubernetes version."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "llmq"
HELM_VERSION = re.search(r"^HELM_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)[1]
HELM = Path.home() / ".cache" / "llmq" / "helm" / HELM_VERSION / "bin" / "helm"
KUBE_VERSION = "1.34.0"  # the cluster version the chart is validated for (kubernetes-validate ships its schemas)

needs_helm = pytest.mark.skipif(
    not HELM.exists(), reason=f"helm {HELM_VERSION} is not installed at {HELM}: run `make helm` (make setup does)"
)


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


def template(*values: Path, sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``helm template`` of the chart as release ``llmq``, with values files and ``--set`` items."""
    files = [arg for path in values for arg in ("-f", str(path))]
    sets_args = [arg for item in sets for arg in ("--set", item)]
    return helm("template", "llmq", str(CHART), "--kube-version", KUBE_VERSION, *files, *sets_args)


def objects(*values: Path, sets: tuple[str, ...] = ()) -> list[dict]:
    result = template(*values, sets=sets)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

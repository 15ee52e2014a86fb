"""No class under ``services/`` is over MAX_CLASS_LINES lines (``class`` line to its last line, by the AST): a class that
grows past it is split along a seam (a part that holds one concern and its state), as BatcherLoop, BatchPolicy, BatchJobs,
WorkerCore and WorkerLoop were."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ROOT / "services"
MAX_CLASS_LINES = 300


def class_sizes(root: Path) -> list[tuple[str, int, str, int]]:
    """(file relative to ``root``'s parent, line, class name, length in lines) of every class in every .py under
    ``root``, nested ones included."""
    sizes = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                sizes.append((str(path.relative_to(root.parent)), node.lineno, node.name, length))
    return sizes


def oversized(root: Path, exempt: Collection[str] = ()) -> list[str]:
    """``file:line Class (N lines)`` of each class over MAX_CLASS_LINES not named in ``exempt``."""
    return [
        f"{file}:{line} {name} ({length} lines)"
        for file, line, name, length in class_sizes(root)
        if length > MAX_CLASS_LINES and name not in exempt
    ]


def test_no_class_under_services_is_over_the_cap():
    offenders = oversized(SERVICES)
    assert not offenders, f"classes over {MAX_CLASS_LINES} lines (split them along a seam):\n" + "\n".join(offenders)


def test_a_planted_oversized_class_is_reported_with_its_place_and_length(tmp_path):
    root = tmp_path / "services"
    (root / "svc").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))  # class line + 300 = 301 lines
    (root / "svc" / "big.py").write_text(f"import os\n\n\nclass Big:\n{body}\n\n\nclass Small:\n    pass\n")
    assert oversized(root) == [f"services/svc/big.py:4 Big ({MAX_CLASS_LINES + 1} lines)"]
    assert oversized(root, {"Big"}) == []

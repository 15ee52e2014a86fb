"""uv.lock and pyproject.toml stay past deps/advisory-floors.toml, and the lock is the one pyproject asks for."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]


def load(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def floors(advisory_floors: dict) -> dict[str, Version]:
    return {canonicalize_name(f["package"]): Version(f["minimum"]) for f in advisory_floors["floor"]}


def lock_below_floors(lock: dict, minimums: dict[str, Version]) -> list[str]:
    """Every locked version (each resolution fork's) under its package's floor."""
    return [
        f"{p['name']} {p['version']} < {minimums[p['name']]}"
        for p in lock["package"]
        if p["name"] in minimums and Version(p["version"]) < minimums[p["name"]]
    ]


def lower_bound(requirement: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=", ">")]
    return max(bounds, default=None)


def pyproject_requirements(pyproject: dict) -> list[Requirement]:
    """Dependencies, extras, build requirements and uv constraints: every floor pyproject states."""
    project = pyproject["project"]
    texts = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
        *pyproject["build-system"]["requires"],
        *pyproject["tool"]["uv"]["constraint-dependencies"],
    ]
    return [Requirement(text) for text in texts]


def pyproject_below_floors(pyproject: dict, minimums: dict[str, Version]) -> list[str]:
    """Each floor must be asked for by pyproject: no requirement of that package, or one allowing less, is a miss."""
    asked: dict[str, list[Version | None]] = {}
    for requirement in pyproject_requirements(pyproject):
        asked.setdefault(canonicalize_name(requirement.name), []).append(lower_bound(requirement))
    problems = []
    for name, minimum in minimums.items():
        bounds = asked.get(name, [])
        if not bounds or any(bound is None or bound < minimum for bound in bounds):
            problems.append(f"{name}: pyproject asks for {bounds or 'nothing'}, the floor is {minimum}")
    return problems


def lock_inputs(lock: dict) -> set[str]:
    """What the lock was resolved for: the project's requirements and uv's constraints, as normalised strings."""
    project = next(p for p in lock["package"] if p["name"] == "llmq")
    rows = [*project["metadata"]["requires-dist"], *lock.get("manifest", {}).get("constraints", [])]
    return {
        str(
            Requirement(
                row["name"]
                + (f"[{','.join(row['extras'])}]" if row.get("extras") else "")
                + row.get("specifier", "")
                + (f"; {row['marker']}" if row.get("marker") else "")
            )
        )
        for row in rows
    }


def pyproject_inputs(pyproject: dict) -> set[str]:
    project, uv = pyproject["project"], pyproject["tool"]["uv"]
    texts = [*project["dependencies"], *uv["constraint-dependencies"]]
    texts += [
        f"{r} {'and' if ';' in r else ';'} extra == '{name}'"
        for name, rs in project["optional-dependencies"].items()
        for r in rs
    ]
    return {str(Requirement(text)) for text in texts}


def test_the_lock_holds_no_version_below_a_floor():
    assert lock_below_floors(load(ROOT / "uv.lock"), floors(load(ROOT / "deps/advisory-floors.toml"))) == []


def test_pyproject_asks_for_every_floor():
    minimums = floors(load(ROOT / "deps/advisory-floors.toml"))
    assert pyproject_below_floors(load(ROOT / "pyproject.toml"), minimums) == []


def test_the_lock_is_resolved_from_this_pyproject():
    """`make lock` was run after the last change to pyproject's requirements (the Makefile installs --frozen)."""
    assert lock_inputs(load(ROOT / "uv.lock")) == pyproject_inputs(load(ROOT / "pyproject.toml"))


def test_a_lock_below_a_floor_is_named():
    lock = {"package": [{"name": "h11", "version": "0.14.0"}, {"name": "h11", "version": "0.16.0"}]}
    assert lock_below_floors(lock, {"h11": Version("0.16.0")}) == ["h11 0.14.0 < 0.16.0"]


def test_a_pyproject_floor_too_low_or_missing_is_named():
    pyproject = {
        "project": {"dependencies": ["python-multipart>=0.0.9", "fastapi"], "optional-dependencies": {}},
        "build-system": {"requires": ["setuptools>=80"]},
        "tool": {"uv": {"constraint-dependencies": []}},
    }
    minimums = {"python-multipart": Version("0.0.18"), "h11": Version("0.16"), "setuptools": Version("78.1.1")}
    assert pyproject_below_floors(pyproject, minimums) == [
        "python-multipart: pyproject asks for [<Version('0.0.9')>], the floor is 0.0.18",
        "h11: pyproject asks for nothing, the floor is 0.16",
    ]

"""The fenced examples of README.md and every docs/**/*.md page, as tests/system/test_docs_examples.py runs them.

Every ```bash and ```python block is an example meant to run verbatim on a fresh stack, twice in a row, unless the
line right before its fence is ``<!-- example: skip (why) -->``. Other fences (```json, ```jsonl, plain ```) show
data or output and never run. A skipped ```bash block whose reason starts with "compose lane" runs in the container
lane instead (tests/compose/test_compose_docs.py, ``make compose-test``): docker compose steps, on a Docker engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
RUNNABLE = ("bash", "python")
SKIP = re.compile(r"<!-- example: skip \((?P<reason>.*)\) -->")
COMPOSE_LANE = "compose lane"
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Example:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence, from 1
    lang: str
    code: str
    skip: str | None  # why the block does not run; None: it runs

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.skip is None

    @property
    def in_compose_lane(self) -> bool:
        return self.lang == "bash" and (self.skip or "").startswith(COMPOSE_LANE)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def examples(path: Path) -> list[Example]:
    """Every fenced block of one Markdown file, in order."""
    text = path.read_text()
    found = []
    for fence in FENCE.finditer(text):
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.fullmatch(before.strip())
        found.append(
            Example(
                doc=str(path.relative_to(ROOT)),
                line=text.count("\n", 0, fence.start()) + 1,
                lang=fence["lang"].strip(),
                code=fence["code"],
                skip=skip["reason"] if skip else None,
            )
        )
    return found


def all_examples() -> list[Example]:
    return [example for path in DOCUMENTS for example in examples(path)]

"""The numbers of each fault run, kept in one JSON file and rendered as docs/faults.md's table.

``python -m tests.system.faults.report [var/faults/report.json]`` prints the table of the last run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tests.system.faults.loadgen import Ending, Tally


class FaultReport:
    """Rows keyed by fault name: requests, lost, answered twice, p99 (ms) during the fault and after it, notes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record_split(self, fault: str, total: Tally, start_s: float, end_s: float, note: str = "") -> dict:
        """:meth:`record` of ``total`` split at the fault: during it from ``start_s`` to ``end_s``, after it from
        ``end_s`` on."""
        during, after = total.where(since_s=start_s, until_s=end_s), total.where(since_s=end_s)
        return self.record(fault, during, after, note, total=total)

    def record(self, fault: str, during: Tally, after: Tally, note: str = "", total: Tally | None = None) -> dict:
        """Store one fault's row (``total`` defaults to during + after) and return it."""
        total = total or Tally([*during.records, *after.records])
        row = {
            "fault": fault,
            "requests": len(total),
            "answered_once": total.count(Ending.ONCE),
            "clear_errors": total.count(Ending.ERROR),
            "timeouts_504": total.count(Ending.TIMEOUT),
            "lost": total.count(Ending.LOST) + total.count(Ending.DROPPED),
            "answered_twice": total.count(Ending.TWICE) + total.count(Ending.WRONG),
            "p99_during_ms": _ms(during.p99_ms()),
            "p99_after_ms": _ms(after.p99_ms()),
            "note": note,
        }
        rows = self.rows()
        rows[fault] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(rows, indent=1))
        return row

    def rows(self) -> dict[str, dict]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def markdown(self) -> str:
        lines = [
            "| fault | requests | answered once | clear errors | 504 | lost | answered twice | p99 during | p99 after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in self.rows().values():
            lines.append(
                f"| {row['fault']} | {row['requests']} | {row['answered_once']} | {row['clear_errors']} | "
                f"{row['timeouts_504']} | {row['lost']} | {row['answered_twice']} | "
                f"{_cell(row['p99_during_ms'])} | {_cell(row['p99_after_ms'])} |"
            )
        return "\n".join(lines)


def _ms(value: float) -> int | None:
    return None if math.isnan(value) else round(value)


def _cell(value: int | None) -> str:
    return "-" if value is None else f"{value} ms"


if __name__ == "__main__":
    report = FaultReport(Path(sys.argv[1] if len(sys.argv) > 1 else "var/faults/report.json"))
    print(report.markdown())
    for row in report.rows().values():
        print(f"- {row['fault']}: {row['note']}")

"""The job's end: the joined output and dead-letter files, and the summary (counts, rounds, tokens, cost, time)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from llmq_cli.batchrun.jobfile import Job
from llmq_cli.batchrun.manifest import PRIVATE_DIR, PRIVATE_FILE, Manifest
from llmq_cli.batchrun.outcomes import OUTCOMES


@dataclass(frozen=True, slots=True)
class Prices:
    """Standard prices per million tokens and the batch discount (0.5: batch work costs half)."""

    input_per_m: float = 0.0
    output_per_m: float = 0.0
    batch_discount: float = 0.5


@dataclass(frozen=True, slots=True)
class Written:
    accepted: int
    dead_lettered: int
    dead_letter_reasons: dict[str, int]


def write_outputs(job: Job, manifest: Manifest, output: Path, dead_letters: Path) -> Written:
    """One output line per custom_id in the job's order: the accepted result line as the target returned it, or for
    an id without one ``response: null`` and its last error marked ``dead_letter``; the dead-letter file has those
    ids again, with their line number in the job and every failure (round, shard, outcome, code, message). Both are
    written 0600."""
    reasons: Counter[str] = Counter()
    accepted = 0
    out_tmp, dead_tmp = output.with_name(output.name + ".tmp"), dead_letters.with_name(dead_letters.name + ".tmp")
    with _private(out_tmp) as out, _private(dead_tmp) as dead:
        for line in job.lines:
            result = manifest.result_line(line.custom_id)
            if result is not None:
                accepted += 1
                out.write(result + "\n")
                continue
            failures = manifest.failures(line.custom_id)
            last = failures[-1] if failures else {"code": "not_run", "message": "the job never ran this line"}
            reasons[last["code"]] += 1
            error = {"code": last["code"], "message": last["message"], "dead_letter": True}
            out.write(json.dumps({"custom_id": line.custom_id, "response": None, "error": error}) + "\n")
            dead.write(json.dumps({"custom_id": line.custom_id, "line": line.number, "failures": failures}) + "\n")
    os.replace(out_tmp, output)
    os.replace(dead_tmp, dead_letters)
    return Written(accepted, len(job.lines) - accepted, dict(reasons.most_common()))


def _private(path: Path) -> TextIO:
    """``path`` opened to be written anew, readable by its owner only (0600; a folder made for it 0700)."""
    path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # a file left by an earlier run keeps its mode otherwise
    return os.fdopen(fd, "w")


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


def summary(
    job: Job,
    manifest: Manifest,
    written: Written,
    *,
    max_rounds: int,
    window_s: int,
    prices: Prices,
    started_s: float,
    now_s: float,
    deadline_s: float | None,
    files: dict[str, str],
) -> dict:
    """Everything the run did, as JSON-able data: counts per outcome (all attempts, and per round), rounds, shards,
    tokens (every answer returned is billed, an answer refused by --json-schema too), the cost at batch and at
    standard prices, and the time budget (rounds x window) against the deadline."""
    by_round = manifest.outcome_counts()
    totals = {name: sum(round_.get(name, 0) for round_ in by_round.values()) for name in OUTCOMES}
    shards = manifest.shards()
    tokens_in, tokens_out = manifest.tokens()
    standard = (tokens_in * prices.input_per_m + tokens_out * prices.output_per_m) / 1e6
    budget_s = max_rounds * window_s
    return {
        "requests": len(job.lines),
        "accepted": written.accepted,
        "dead_lettered": written.dead_lettered,
        "dead_letter_reasons": written.dead_letter_reasons,
        "outcomes": totals,
        "outcomes_by_round": [{"round": r, **{n: by_round[r].get(n, 0) for n in OUTCOMES}} for r in sorted(by_round)],
        "rounds_used": 1 + max((s.round for s in shards), default=0),
        "max_rounds": max_rounds,
        "shards": len(shards),
        "batches": [s.batch_id for s in shards if s.batch_id],
        "uploads_left": len(
            manifest.uploads_to_delete()
        ),  # shard files the target refused to delete (next run retries)
        "tokens": {"input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out},
        "cost": {
            "batch": round(standard * (1 - prices.batch_discount), 6),
            "standard": round(standard, 6),
            "batch_discount": prices.batch_discount,
        },
        "time": {
            "started_at": _iso(started_s),
            "elapsed_s": round(now_s - started_s, 1),
            "window_s": window_s,
            "budget_s": budget_s,
            "budget_ends_at": _iso(started_s + budget_s),
            "deadline_at": _iso(deadline_s) if deadline_s is not None else None,
            "budget_fits_deadline": None if deadline_s is None else started_s + budget_s <= deadline_s,
        },
        "files": files,
    }


def conclude(job: Job, manifest: Manifest, output: Path, **terms) -> tuple[Written, dict]:
    """The run's end: ``output`` and its dead-letter file (``<output stem>.dead-letter.jsonl``) written, and the
    :func:`summary` (``terms``: its keyword arguments but ``files``) naming both files and the manifest."""
    dead_letters = output.with_name(f"{output.stem}.dead-letter.jsonl")
    written = write_outputs(job, manifest, output, dead_letters)
    files = {"output": str(output), "dead_letter": str(dead_letters), "manifest": str(manifest.path)}
    return written, summary(job, manifest, written, files=files, **terms)

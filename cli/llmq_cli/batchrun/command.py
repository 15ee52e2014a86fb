"""``llmq batch run JOB.jsonl --output OUT.jsonl``: the whole pipeline for a job larger than one batch."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import jsonschema
import openai
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmq_cli.batch import API_KEY, BASE_URL
from llmq_cli.batchrun.anthropic_api import AnthropicBatchApi
from llmq_cli.batchrun.api import BatchApi, BatchState, OpenAIBatchApi
from llmq_cli.batchrun.jobfile import IdTemplate, Job, JobFileError, read_job
from llmq_cli.batchrun.manifest import COLLECTED, Manifest, ManifestError, Shard, open_manifest
from llmq_cli.batchrun.outcomes import OUTCOMES, Validator, schema_validator
from llmq_cli.batchrun.pipeline import Pipeline, RunConfig
from llmq_cli.batchrun.report import Prices, conclude
from llmq_cli.batchrun.shard import shard_limits
from llmq_jobs.jobs import parse_window

ANY_WINDOW_S = 10**9  # the target says how long a window it takes; here only the shape is checked
SHOWN_PROBLEMS = 50
err = Console(stderr=True)


class RichDisplay:
    """A progress bar for the job (accepted results of all) and one per shard (its lines settled)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._overall = progress.add_task("overall", total=None)
        self._shards: dict[int, TaskID] = {}

    def shard(self, shard: Shard, state: BatchState | None) -> None:
        task = self._shards.get(shard.number)
        if task is None:
            task = self._shards[shard.number] = self._progress.add_task("", total=shard.requests)
        status = state.status if state else shard.status
        done = shard.requests if shard.status == COLLECTED else state.done if state else 0
        self._progress.update(task, description=f"shard {shard.number} (round {shard.round}) {status}", completed=done)

    def overall(self, round_: int, accepted: int, total: int) -> None:
        self._progress.update(
            self._overall, description=f"overall (round {round_}) accepted", completed=accepted, total=total
        )


def _fail(message: str, as_json: bool, **extra) -> typer.Exit:
    if as_json:
        typer.echo(json.dumps({"error": {"message": message, **extra}}))
    else:
        err.print(f"[red]{message}[/red]")
        for problem in extra.get("lines", [])[:SHOWN_PROBLEMS]:
            err.print(f"  line {problem['line']}: {problem['message']}")
    return typer.Exit(2)


def _seconds(text: str, flag: str) -> int:
    try:
        return parse_window(text, ANY_WINDOW_S)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from exc


def run(
    job_file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="The job: OpenAI batch request lines (JSONL)."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Joined results: one line per custom_id, in job order."),
    state: Path | None = typer.Option(None, "--state", help="Folder of the manifest (default: <output>.state)."),
    window: str = typer.Option("24h", "--window", help="Completion window of every shard (24h, 6h, 10m, 90s)."),
    max_rounds: int = typer.Option(2, "--max-rounds", min=1, help="Rounds in all: the first run and its retries."),
    shard_max_requests: int | None = typer.Option(None, min=1, help="Requests per shard (default: target's - 5%)."),
    shard_max_bytes: int | None = typer.Option(None, min=1, help="Bytes per shard file (default: target's - 5%)."),
    id_template: str | None = typer.Option(None, help="Build custom_ids from line fields, e.g. '{doc_id}-v{version}'."),
    json_schema: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="JSON Schema file: a succeeded answer must be JSON matching it."
    ),
    max_active_shards: int = typer.Option(8, min=1, help="Shards submitted and not yet ended, at most."),
    poll_interval_s: float = typer.Option(10.0, min=0.05, help="Seconds between polls of the running shards."),
    price_input_per_m: float = typer.Option(0.0, help="Standard price per million input tokens."),
    price_output_per_m: float = typer.Option(0.0, help="Standard price per million output tokens."),
    batch_discount: float = typer.Option(0.5, min=0, max=1, help="Share batch work saves on the standard price."),
    deadline: str | None = typer.Option(None, help="When the job must be done, from its first start (e.g. 48h)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (and no progress)."),
    restart: bool = typer.Option(
        False, "--restart", help="Forget the state folder's manifest and run the whole job again (billed again)."
    ),
    api_format: str = typer.Option(
        "openai",
        "--format",
        help="openai: /v1/files and /v1/batches; anthropic: Message Batches (the job's url /v1/messages, each body a "
        "Messages request).",
    ),
    base_url: str = BASE_URL,
    api_key: str = API_KEY,
) -> None:
    """Shard JOB_FILE to fit the target's batch limits, submit and poll the shards, store every result in a manifest
    as each shard ends, retry the ids still missing in smaller shards (--max-rounds), then write OUTPUT and its
    dead-letter file (<output stem>.dead-letter.jsonl) and print a summary. Run it again to resume after a stop."""
    window_s = _seconds(window, "--window")
    deadline_after_s = _seconds(deadline, "--deadline") if deadline else None
    template, validate = _checks(id_template, json_schema)
    job = _read(job_file, template, as_json)
    state = state or output.with_name(output.name + ".state")
    manifest = _manifest(state, job, restart, as_json)
    started_s = float(manifest.put_default("started_at", repr(time.time())))
    deadline_s = started_s + deadline_after_s if deadline_after_s is not None else None
    if deadline_s is not None and started_s + max_rounds * window_s > deadline_s and not as_json:
        err.print(f"[yellow]{max_rounds} rounds x {window} may end after the deadline ({deadline} from the start)[/]")
    api = _api(api_format, base_url, api_key, state)
    limits = shard_limits(api.limits(), shard_max_requests, shard_max_bytes)
    config = RunConfig(window, max_rounds, limits, max_active_shards, poll_interval_s)
    _run(Pipeline(api, manifest, job, config, template=template, validate=validate), as_json)
    try:
        written, report = conclude(
            job,
            manifest,
            output,
            max_rounds=max_rounds,
            window_s=window_s,
            prices=Prices(price_input_per_m, price_output_per_m, batch_discount),
            started_s=started_s,
            now_s=time.time(),
            deadline_s=deadline_s,
        )
    except sqlite3.DatabaseError as exc:
        raise _fail(_unreadable(manifest, exc), as_json) from exc
    manifest.close()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_summary(report)
    if written.dead_lettered:
        raise typer.Exit(1)


def _api(api_format: str, base_url: str, api_key: str, state: Path) -> BatchApi:
    if api_format == "anthropic":
        return AnthropicBatchApi(base_url, api_key, state / "shards")
    if api_format != "openai":
        raise typer.BadParameter(f"must be openai or anthropic, got {api_format!r}", param_hint="--format")
    return OpenAIBatchApi(base_url, api_key)


def _checks(id_template: str | None, json_schema: Path | None) -> tuple[IdTemplate | None, Validator | None]:
    try:
        template = IdTemplate(id_template) if id_template else None
        validate = schema_validator(json.loads(json_schema.read_text())) if json_schema else None
    except (ValueError, jsonschema.SchemaError) as exc:
        raise typer.BadParameter(str(getattr(exc, "message", exc))) from exc
    return template, validate


def _read(job_file: Path, template: IdTemplate | None, as_json: bool) -> Job:
    try:
        return read_job(job_file, template)
    except JobFileError as exc:
        lines = [{"line": p.line, "message": p.message} for p in exc.problems]
        message = f"{exc.count} line(s) of {job_file} are refused; nothing was uploaded"
        raise _fail(message, as_json, lines=lines) from exc


def _manifest(state: Path, job: Job, restart: bool, as_json: bool) -> Manifest:
    try:
        return open_manifest(state / "manifest.sqlite", job.digest, restart=restart)
    except ManifestError as exc:
        raise _fail(str(exc), as_json) from exc


def _unreadable(manifest: Manifest, exc: sqlite3.DatabaseError) -> str:
    return f"{manifest.path} cannot be read ({exc}): restore it, or pass --restart to run the whole job again"


def _run(pipeline: Pipeline, as_json: bool) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, disable=as_json) as progress:
            pipeline.display = RichDisplay(progress)
            pipeline.run()
    except sqlite3.DatabaseError as exc:
        raise _fail(_unreadable(pipeline.manifest, exc), as_json) from exc
    except openai.APIError as exc:
        raise _fail(f"the batch API failed: {exc}; run the same command again to resume", as_json) from exc
    except KeyboardInterrupt as exc:
        raise _fail("stopped; run the same command again to resume", as_json) from exc


def _print_summary(report: dict) -> None:
    table = Table(show_header=False, title="llmq batch run")
    cost, tokens, when = report["cost"], report["tokens"], report["time"]
    fits = {True: "fits", False: "EXCEEDS", None: "no deadline given"}[when["budget_fits_deadline"]]
    rows = [
        ("requests", f"{report['requests']}: {report['accepted']} accepted, {report['dead_lettered']} dead-lettered"),
        ("dead-letter reasons", ", ".join(f"{k} {v}" for k, v in report["dead_letter_reasons"].items()) or "-"),
        ("outcomes (all rounds)", ", ".join(f"{k} {report['outcomes'][k]}" for k in OUTCOMES)),
        *((f"  round {r['round']}", ", ".join(f"{k} {r[k]}" for k in OUTCOMES)) for r in report["outcomes_by_round"]),
        ("rounds", f"{report['rounds_used']} of {report['max_rounds']}, {report['shards']} shards"),
        ("tokens", f"{tokens['input']} in, {tokens['output']} out"),
        (
            "cost",
            f"{cost['batch']:.4f} at batch prices ({cost['standard']:.4f} standard, {cost['batch_discount']:.0%} off)",
        ),
        (
            "time",
            f"{when['elapsed_s']:.0f} s elapsed; budget {report['max_rounds']} rounds x {when['window_s']} s, ends {when['budget_ends_at']}",
        ),
        ("deadline", f"{when['deadline_at']}: budget {fits}" if when["deadline_at"] else fits),
        *((f"{name} file", path) for name, path in report["files"].items()),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)

"""``llmq batch``: submit OpenAI batch files, follow them, fetch their results, and generate sample input.

Talks to an API pod through the official ``openai`` SDK: ``--base-url`` (env ``LLMQ_API_URL``, default
``http://127.0.0.1:8000/v1``) and ``--api-key`` (env ``LLMQ_API_KEY``, default the dev key ``llmq-dev-key``).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmq_cli.console import make_console
from llmq_cli.lazy import lazy_group
from llmq_jobs import jobs

if TYPE_CHECKING:
    import openai

batch_app = typer.Typer(
    help="Batch jobs (OpenAI /v1/batches): submit, status, results, cancel, sample input, run a whole file.",
    no_args_is_help=True,
    cls=lazy_group({"run": "llmq_cli.batchrun.command:run"}),
)
console = make_console()

ENDED = jobs.TERMINAL_STATUSES
POLL_S = 1.0
BASE_URL = typer.Option("http://127.0.0.1:8000/v1", envvar="LLMQ_API_URL", help="API base URL.")
API_KEY = typer.Option("llmq-dev-key", envvar="LLMQ_API_KEY", help="API key (Bearer).")


def _client(base_url: str, api_key: str) -> openai.OpenAI:
    import openai  # here: the SDK takes 1.6 s to import, and `llmq batch sample` needs none of it

    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=300)


def _endpoint_of(path: Path) -> str:
    """The ``url`` of the file's first request line (the batch's endpoint)."""
    with path.open("rb") as lines:
        for raw in lines:
            if raw.strip():
                return json.loads(raw.decode("utf-8-sig"))["url"]
    raise typer.BadParameter(f"{path} has no request lines")


@batch_app.command("submit")
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="OpenAI batch input file (JSONL)."),
    window: str = typer.Option("24h", "--window", help="Completion window: 24h, 6h, 10m, 90s ..."),
    endpoint: str = typer.Option("", help="Batch endpoint (default: the url of the file's first line)."),
    detach: bool = typer.Option(False, "--detach", help="Print the batch id and return at once."),
    base_url: str = BASE_URL,
    api_key: str = API_KEY,
) -> None:
    """Upload FILE, create a batch, print its id, then show its progress until it ends (unless --detach)."""
    client = _client(base_url, api_key)
    with file.open("rb") as source:
        uploaded = client.files.create(file=source, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint or _endpoint_of(file), completion_window=window
    )
    typer.echo(batch.id)
    if detach:
        return
    batch = _follow(client, batch)
    _print_status(batch)
    if batch.status != "completed":
        raise typer.Exit(1)


def _follow(client: openai.OpenAI, batch) -> object:
    """Poll the batch, drawing a progress bar, until it ends; returns its last state."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(batch.status, total=batch.request_counts.total if batch.request_counts else None)
        while True:
            counts = batch.request_counts
            done = counts.completed + counts.failed if counts else 0
            progress.update(
                task,
                description=f"{batch.id[:18]}… {batch.status}",
                completed=done,
                total=counts.total if counts else None,
            )
            if batch.status in ENDED:
                return batch
            time.sleep(POLL_S)
            batch = client.batches.retrieve(batch.id)


@batch_app.command("status")
def status(batch_id: str, base_url: str = BASE_URL, api_key: str = API_KEY) -> None:
    """Status, line counts, usage, files and (for a failed batch) its errors."""
    _print_status(_client(base_url, api_key).batches.retrieve(batch_id))


def _print_status(batch) -> None:
    counts = batch.request_counts
    extra = (batch.model_extra or {}).get("llmq") or {}
    table = Table(show_header=False, title=batch.id)
    rows = [
        ("status", batch.status),
        ("endpoint", batch.endpoint),
        ("window", batch.completion_window),
        ("lines", f"{counts.total} total, {counts.completed} completed, {counts.failed} failed" if counts else ""),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in extra.items()) if extra else ""),
        ("usage", f"{batch.usage.input_tokens} in, {batch.usage.output_tokens} out" if batch.usage else ""),
        ("output file", batch.output_file_id or ""),
        ("error file", batch.error_file_id or ""),
    ]
    for name in ("created", *jobs.STATUSES[1:]):
        at = getattr(batch, f"{name}_at", None)
        if at:
            rows.append((f"{name} at", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))))
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    for error in batch.errors.data if batch.errors and batch.errors.data else []:
        console.print(f"[red]line {error.line}[/red] {error.code} ({error.param}): {error.message}")


@batch_app.command("results")
def results(
    batch_id: str,
    output: Path = typer.Option(..., "-o", "--output", help="Where the output file (succeeded lines) goes."),
    errors: Path | None = typer.Option(
        None, "--errors", help="Where the error file goes (default: <output stem>.errors.jsonl, when it has lines)."
    ),
    base_url: str = BASE_URL,
    api_key: str = API_KEY,
) -> None:
    """Download the batch's output file (and its error file); partial while the batch still runs."""
    client = _client(base_url, api_key)
    batch = client.batches.retrieve(batch_id)
    if not batch.output_file_id:
        console.print(f"[red]{batch_id} has no results ({batch.status})[/red]")
        raise typer.Exit(1)
    output.write_bytes(client.files.content(batch.output_file_id).read())
    error_bytes = client.files.content(batch.error_file_id).read() if batch.error_file_id else b""
    errors = errors or output.with_name(f"{output.stem}.errors.jsonl")
    if error_bytes:
        errors.write_bytes(error_bytes)
    lines, error_lines = output.read_bytes().count(b"\n"), error_bytes.count(b"\n")
    console.print(
        f"{batch.status}: {lines} lines -> {output}"
        + (f", {error_lines} error lines -> {errors}" if error_bytes else "")
    )


@batch_app.command("cancel")
def cancel(batch_id: str, base_url: str = BASE_URL, api_key: str = API_KEY) -> None:
    """Cancel a batch: lines not yet run end cancelled, running ones are stopped."""
    _print_status(_client(base_url, api_key).batches.cancel(batch_id))


@batch_app.command("sample")
def sample(
    lines: int = typer.Option(300, "--lines", help="How many request lines."),
    output: Path = typer.Option(Path("var/batch/claims-sample.jsonl"), "-o", "--output"),
    model: str = typer.Option(
        "llmq-sim",
        help="Model of every line: llmq-sim (simulated: fast, replays the prompt) "
        "or llmq-tiny (a small transformer with random weights: slow on "
        "a CPU, its text is noise).",
    ),
    seed: int = typer.Option(0, help="Same seed, same file."),
) -> None:
    """Write an OpenAI batch input file of insurance-claim classify-and-summarise chat requests."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(line) + "\n" for line in sample_lines(lines, model, seed)))
    console.print(f"wrote {lines} lines -> {output}")


# --- sample input -----------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are a claims assistant. Classify the claim as one of: property, motor, liability, theft. Then "
    "summarise it in at most three sentences for an adjuster. Answer as JSON with keys category and "
    "summary."
)
PERILS = {
    "property": [
        "hail damage to roof tiles",
        "water damage to the kitchen ceiling",
        "a burst pipe in the basement",
        "a storm-felled tree on a fence",
        "a chimney fire",
        "a flooded ground floor after heavy rain",
    ],
    "motor": [
        "a rear-end collision at a junction",
        "a cracked windscreen from road debris",
        "a scraped door in a car park",
        "a collision with a deer at night",
    ],
    "liability": [
        "a visitor slipping on a wet floor",
        "a falling flower pot hitting a parked car",
        "a dog biting a delivery rider",
        "a leak damaging the flat below",
    ],
    "theft": [
        "a laptop stolen from a parked car",
        "a bicycle stolen from a locked shed",
        "jewellery taken during a break-in",
        "tools stolen from a van overnight",
    ],
}
PLACES = [
    "a ground-floor flat",
    "a rented office",
    "a detached house",
    "a corner shop",
    "a holiday cottage",
    "a farm building",
    "a city-centre apartment",
]
NOTES = [
    "Photos were uploaded on the day of the event.",
    "A contractor quote is attached.",
    "No receipts are available.",
    "A neighbour witnessed the event.",
    "The police were informed.",
    "The policyholder asks for an urgent visit.",
    "A previous claim was made last year.",
]
MAX_TOKENS = (48, 64, 96)


def sample_lines(count: int, model: str = "llmq-sim", seed: int = 0) -> list[dict]:
    """``count`` batch input lines (chat completions) with unique custom ids; deterministic for a seed."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        category = rng.choice(sorted(PERILS))
        claim = 7_700_000 + 7 * i + 100_000 * seed
        text = (
            f"Claim {claim}. Reported {rng.randint(0, 30)} days after the event. The policyholder describes "
            f"{rng.choice(PERILS[category])} at {rng.choice(PLACES)}. Estimated loss "
            f"{rng.randint(200, 50_000)} EUR. {rng.choice(NOTES)}"
        )
        lines.append(
            {
                "custom_id": f"claim-{claim}-s{seed}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "max_tokens": rng.choice(MAX_TOKENS),
                    "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
                },
            }
        )
    return lines

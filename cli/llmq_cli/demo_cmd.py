"""``llmq demo`` and ``llmq prompts``: real code-completion prompts (and chat questions to the real model) through
the openai SDK against the local stack, and the prompts alone as JSONL."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import typer
from rich.table import Table

from llmq_bench import prompts
from llmq_cli import demo as demo_mod
from llmq_cli.console import make_console
from llmq_cli.dev import STATE_DIR, dev_up, stack_of
from llmq_cli.options import ApiPort, KafkaPort, RedisPort, Seed
from llmq_core.models import SMOLLM2_135M_INSTRUCT

console = make_console()


def make_prompts(
    count: int = typer.Option(300),
    seed: Seed = 0,
    output: Path = typer.Option(Path("var/demo/prompts-code.jsonl"), "-o"),
) -> None:
    """Write code-completion prompts cut from this machine's Python standard library as JSONL."""
    console.print(f"wrote {prompts.write_jsonl(prompts.cut_prompts(count, seed=seed), output)}")


def run_demo(
    requests: int = typer.Option(150, help="Code-completion prompts for the --models (simulated) load."),
    concurrency: int = typer.Option(32, help="Requests in flight at once (the --models load)."),
    models: str = typer.Option("llmq-sim", help="Comma-separated models for the code prompts, used in turn."),
    real_model: str = typer.Option(SMOLLM2_135M_INSTRUCT.name, help="The real model ('' to skip its part)."),
    real_code: int = typer.Option(24, help="Code-completion prompts (200-800 characters) to the real model."),
    real_chat: int = typer.Option(12, help="Short chat questions to the real model."),
    real_concurrency: int = typer.Option(8, help="Real-model requests in flight at once."),
    up: bool = typer.Option(True, help="Start the local stack first (no-op for what already runs)."),
    state_dir: Path = STATE_DIR,
    kafka_port: KafkaPort = 9092,
    redis_port: RedisPort = 6379,
    api_port: ApiPort = 8000,
) -> None:
    """Send real code-completion prompts (and chat questions to the real model) through the openai SDK to both API
    pods; print a latency table and three of the real model's answers."""
    stack = stack_of(state_dir, kafka_port=kafka_port, redis_port=redis_port, api_port=api_port)
    if up:
        dev_up(
            state_dir=state_dir,
            tiny_workers=1,
            sim_workers=2,
            sim_batch_time_ms=500,
            smollm2_workers=1 if real_model else 0,
            kafka_port=kafka_port,
            redis_port=redis_port,
            api_port=api_port,
            keys_file=None,
            secure=False,  # called as a function: every option needs its value, not its typer default
            region=None,
            port_base=None,
            peer=[],
        )
    cut = prompts.cut_prompts(requests)
    prompts.write_jsonl(cut, Path("var/demo/prompts-code.jsonl"))
    model_names = models.split(",")
    phases = [demo_mod.code_asks(cut, model_names)]
    if real_model:
        code = prompts.cut_prompts(real_code, seed=1, max_chars=800, max_tokens=(16, 24, 32))
        chat = prompts.CHAT_QUESTIONS[:real_chat]
        phases.append(demo_mod.code_asks(code, [real_model]) + demo_mod.chat_asks(chat, real_model, max_tokens=48))
    urls = [f"http://127.0.0.1:{p}/v1" for p in stack.cfg.api_ports]
    reports, started = [], time.perf_counter()
    for asks, gate in zip(phases, (concurrency, real_concurrency)):  # one after the other: each has the CPU alone
        names = list(dict.fromkeys(a.model for a in asks))
        before = {m: demo_mod.batcher_counts(stack.cfg.redis_url, m) for m in names}
        phase = asyncio.run(demo_mod.run_demo(asks, urls, gate, stack.cfg.redis_url))
        for report in phase:
            (b0, r0), (b1, r1) = before[report.model], demo_mod.batcher_counts(stack.cfg.redis_url, report.model)
            report.mean_batch_size = (r1 - r0) / (b1 - b0) if b1 > b0 else 0.0
        reports += phase
    _print_demo(reports, time.perf_counter() - started, real_model)


def _print_demo(reports: list[demo_mod.ModelReport], wall_s: float, real_model: str) -> None:
    table = Table(
        "model",
        "requests",
        "successes",
        "errors",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "TTFT p50 ms",
        "completion tok/s",
        "mean Kafka batch",
        "mean running (engine)",
        title=f"llmq demo: {sum(r.requests for r in reports)} requests, {wall_s:.1f}s",
    )
    rows = demo_mod.summary_rows(reports)
    for row in rows:
        table.add_row(
            row["model"],
            str(row["requests"]),
            str(row["successes"]),
            str(row["errors"]),
            f"{row['p50_ms']:.0f}",
            f"{row['p95_ms']:.0f}",
            f"{row['p99_ms']:.0f}",
            f"{row['ttft_p50_ms']:.0f}",
            f"{row['completion_tokens_per_s']:.1f}",
            f"{row['mean_batch_size']:.1f}",
            f"{row['mean_running']:.1f}",
        )
    console.print(table)
    for report in reports:
        if report.model == real_model:
            for ask, answer in demo_mod.samples(report.answers, 3):
                console.print(f"[bold]{'chat' if ask.question else 'code'} ->[/bold] {ask.text.strip()[-300:]}")
                console.print(f"[green]{real_model}:[/green] {answer.strip()}\n")
    if any(row["errors"] for row in rows):
        for report in reports:
            if report.errors:
                console.print(f"[red]{report.model} errors:[/red] {report.errors}")
        raise typer.Exit(1)

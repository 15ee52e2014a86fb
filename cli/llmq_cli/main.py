"""``llmq``: the command line of the project (local stack, batch jobs, regions, benchmarks, simulator, capacity
math, demo). Each subcommand's module is imported when it runs (:mod:`llmq_cli.lazy`)."""

from __future__ import annotations

import typer

from llmq_cli.lazy import lazy_group

COMMANDS = {
    "dev": "llmq_cli.dev:dev",
    "batch": "llmq_cli.batch:batch_app",
    "bench": "llmq_cli.bench_cmd:bench",
    "region": "llmq_cli.region:region_app",
    "slo": "llmq_cli.slo:slo",
    "simulate": "llmq_cli.sizing:simulate",
    "capacity": "llmq_cli.sizing:capacity",
    "topics": "llmq_cli.topics:create_topics",
    "prompts": "llmq_cli.demo_cmd:make_prompts",
    "demo": "llmq_cli.demo_cmd:run_demo",
}

app = typer.Typer(no_args_is_help=True, cls=lazy_group(COMMANDS))


@app.callback()
def llmq() -> None:
    """llmq: a batching system for LLM queries over Kafka and Redis."""


if __name__ == "__main__":
    app()

"""``llmq dev``: the local stack as processes (Kafka, Redis, API pods, batcher, workers, result-router), a region's
whole stack beside another, MirrorMaker 2 between them, and reply topics for Kafka-direct producers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmq_cli import kafka_dist, mirror
from llmq_cli.console import make_console
from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.options import ApiPort, AsJson, KafkaPort, RedisPort
from llmq_core.ids import DEFAULT_REGION
from llmq_core.kafka import create_topic, reply_topic_error, reply_topic_prefixes
from llmq_core.settings import load_settings

dev = typer.Typer(
    help="Run the local stack as processes (Kafka, Redis, API pods, batcher, workers, result-router).",
    no_args_is_help=True,
)
console = make_console()

STATE_DIR = typer.Option(Path("var/dev"), help="Folder for pid files, logs and Kafka data.")


def stack_of(
    state_dir: Path,
    api_port: int = 8000,
    keys_file: Path | None = None,
    region: str | None = None,
    port_base: int | None = None,
    peers: tuple[str, ...] = (),
    **shape,
) -> DevStack:
    """The stack of two API pods from ``api_port`` on, or a region's whole stack (``region``, ``port_base``: ports
    from the base); ``shape``: the rest of :class:`StackConfig` (its defaults)."""
    # Every process reads the keys file: API pods authenticate with it, the batcher and router label metrics by tenant.
    extra_env = {"LLMQ_API_KEYS_FILE": str(keys_file.resolve())} if keys_file else {}
    shape.update(extra_env=extra_env, peer_regions=peers)
    if region is not None or port_base is not None:
        for port in ("kafka_port", "redis_port"):  # a region's ports come from its base
            shape.pop(port, None)
        return DevStack(_region_config(state_dir, region, port_base, **shape))
    return DevStack(StackConfig(state_dir=state_dir, api_ports=(api_port, api_port + 1), **shape))


def _region_config(state_dir: Path, region: str | None, port_base: int | None, **config) -> StackConfig:
    """A region's stack (``--region``, ``--port-base``): its state in ``<state-dir>/<region>``."""
    try:
        return StackConfig.for_region(region or DEFAULT_REGION, port_base or 9092, state_dir, **config)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--region") from exc


REGION = typer.Option(
    None, help="A region's whole stack (LLMQ_REGION: lower-case a-z 0-9 -), its state in <state-dir>/<region>."
)
PORT_BASE = typer.Option(
    None,
    help="With --region: ports from N (Kafka N, Redis N+5, API pods N+10 and N+11, /metrics from N+20); regions side "
    "by side take bases at least 100 apart.",
)


@dev.command("install")
def dev_install() -> None:
    """Assemble the Kafka broker and MirrorMaker 2 from Maven Central (cached under ~/.cache/llmq)."""
    console.print(f"kafka jars: {kafka_dist.ensure_installed()}")
    console.print(f"mirrormaker 2 jars: {kafka_dist.ensure_mirror_installed()}")


@dev.command("up")
def dev_up(
    state_dir: Path = STATE_DIR,
    tiny_workers: int = typer.Option(1, help="Workers serving llmq-tiny (transformers engine)."),
    sim_workers: int = typer.Option(2, help="Workers serving llmq-sim (simulated engine)."),
    sim_batch_time_ms: int = typer.Option(500, help="llmq-sim's fixed time per batch, ms."),
    smollm2_workers: int = typer.Option(
        1, help="Workers serving smollm2-135m-instruct, a real model (transformers engine; `make setup` installs it)."
    ),
    batchers: Annotated[
        int, typer.Option(min=1, help="Batcher processes (one consumer group; instance ids batcher-0, batcher-1, ...).")
    ] = 1,
    routers: Annotated[
        int,
        typer.Option(
            min=1, help="Result-router processes (one consumer group; result-router-0, result-router-1, ...)."
        ),
    ] = 1,
    kafka_port: KafkaPort = 9092,
    redis_port: RedisPort = 6379,
    api_port: ApiPort = 8000,
    keys_file: Path | None = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="API keys file (YAML/JSON, like deploy/keys.example.yaml): sets "
        "LLMQ_API_KEYS_FILE for every process (the environment's own "
        "LLMQ_API_KEYS_FILE works too).",
    ),
    secure: bool = typer.Option(
        False,
        help="Kafka SASL_SSL (SCRAM-SHA-512) with ACLs and Redis TLS with ACL users, one principal per service role; "
        "CA, certificates and passwords under <state-dir>/secrets (docs/security.md).",
    ),
    region: str | None = REGION,
    port_base: int | None = PORT_BASE,
    peer: list[str] = typer.Option(
        [], help="A region mirrored to and from this one (repeatable); with --secure: MirrorMaker 2's ACLs (mm2)."
    ),
) -> None:
    """Start the stack (Kafka 127.0.0.1:9092, Redis :6379, API pods :8000 and :8001) and wait until it is healthy."""
    stack = stack_of(
        state_dir,
        api_port,
        keys_file,
        tiny_workers=tiny_workers,
        sim_workers=sim_workers,
        sim_batch_time_ms=sim_batch_time_ms,
        kafka_port=kafka_port,
        redis_port=redis_port,
        smollm2_workers=smollm2_workers,
        batchers=batchers,
        routers=routers,
        secure=secure,
        region=region,
        port_base=port_base,
        peers=tuple(peer),
    )
    started = time.perf_counter()
    try:
        stack.up(log=console.print)
    except RuntimeError as exc:
        console.print(f"[red]dev up failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    console.print(f"stack healthy in {time.perf_counter() - started:.1f}s; logs in {stack.logs}")


@dev.command("status")
def dev_status(
    state_dir: Path = STATE_DIR,
    as_json: AsJson = False,
    redis_port: RedisPort = 6379,
    secure: bool = typer.Option(False, help="The stack was started with --secure."),
    region: str | None = REGION,
    port_base: int | None = PORT_BASE,
) -> None:
    """Each process the stack started: name, model, pid, the port it listens on, its /metrics port and health."""
    if region or port_base:
        cfg = _region_config(state_dir, region, port_base, secure=secure)
    else:
        cfg = StackConfig(state_dir=state_dir, redis_port=redis_port, secure=secure)
    rows = DevStack(cfg).status()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"nothing runs: no process started by `llmq dev up` under {state_dir.resolve()}")
        return
    table = Table("process", "kind", "model", "pid", "port", "metrics port", "health")
    for row in rows:
        colour = {"healthy": "green", "starting": "yellow"}.get(row["health"], "red")
        table.add_row(
            row["name"],
            row["kind"],
            row["model"],
            str(row["pid"]),
            str(row["port"] or ""),
            str(row["metrics_port"] or ""),
            f"[{colour}]{row['health']}[/{colour}]",
        )
    console.print(table)


@dev.command("down")
def dev_down(state_dir: Path = STATE_DIR, region: str | None = REGION) -> None:
    """Stop exactly the processes `llmq dev up` started (from their pid files); with --region, that region's (its
    MirrorMaker 2 too)."""
    cfg = _region_config(state_dir, region, None) if region else StackConfig(state_dir=state_dir)
    stopped = DevStack(cfg).down()
    console.print(f"stopped: {', '.join(stopped) or 'nothing'}")


@dev.command("mirror")
def dev_mirror(
    source: str = typer.Option(..., help="Region whose batch-job topics and results are copied."),
    source_port_base: int = typer.Option(..., help="The source region's --port-base."),
    target: str = typer.Option(..., help="Region that receives them, where MirrorMaker 2 runs."),
    target_port_base: int = typer.Option(..., help="The target region's --port-base."),
    state_dir: Path = STATE_DIR,
    test_intervals: bool = typer.Option(
        False,
        help="Notice new topics and groups and emit checkpoints every 5 s (MirrorMaker 2's defaults: 600/600/60).",
    ),
    secure: bool = typer.Option(False, help="Both regions run --secure: MirrorMaker 2 signs in as principal mm2."),
) -> None:
    """Start MirrorMaker 2 in the target region for the flow source -> target (run it once per direction); `llmq dev
    down --region <target>` stops it with the target's stack."""
    source_cfg = _region_config(state_dir, source, source_port_base, secure=secure)
    target_stack = DevStack(_region_config(state_dir, target, target_port_base, secure=secure))
    intervals = mirror.TEST_INTERVALS_S if test_intervals else mirror.PRODUCTION_INTERVALS_S
    target_stack.mirror(source_cfg, mirror.MirrorOptions(intervals_s=dict(intervals)))
    console.print(f"mirrormaker 2 {source} -> {target} started; log in {target_stack.logs}/mirror-{source}.log")


@dev.command("create-topic")
def dev_create_topic(
    name: str = typer.Argument(..., help="Topic to create, e.g. a Kafka reply topic such as my.replies."),
    partitions: int = typer.Option(1, min=1, help="Partitions of the new topic."),
) -> None:
    """Create a Kafka reply topic on LLMQ_KAFKA_BOOTSTRAP_SERVERS: the broker does not auto-create topics, so a
    Kafka-direct producer creates its reply topic before its first request. Names llmq refuses as reply topics
    (Kafka's internal ones, llmq.*, outside LLMQ_KAFKA_REPLY_TOPIC_PREFIXES) are refused here too."""
    settings = load_settings()
    refused = reply_topic_error(name, reply_topic_prefixes(settings))
    if refused is not None:
        console.print(f"[red]refused:[/red] {refused}")
        raise typer.Exit(2)
    created = asyncio.run(create_topic(settings, name, partitions))
    console.print(f"{'created' if created else 'exists already:'} {name} on {settings.kafka.bootstrap_servers}")

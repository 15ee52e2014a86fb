"""``llmq``: the command line of the project (local stack, demo, simulator, capacity math)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import typer
from rich.table import Table

from llmq_bench import prompts
from llmq_cli import demo as demo_mod
from llmq_cli import kafka_dist, mirror
from llmq_cli.batch import batch_app
from llmq_cli.batchrun.command import run as batch_run
from llmq_cli.bench_cmd import bench
from llmq_cli.console import make_console
from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.options import ApiPort, AsJson, BatchTimeMs, DurationS, KafkaPort, MaxBatch, RedisPort, Seed
from llmq_cli.region import region_app
from llmq_cli.slo import slo
from llmq_core import security
from llmq_core.ids import DEFAULT_REGION
from llmq_core.kafka import create_topic, ensure_topics, reply_topic_error, reply_topic_prefixes
from llmq_core.models import SMOLLM2_135M_INSTRUCT
from llmq_core.settings import load_settings

app = typer.Typer(help="llmq: a batching system for LLM queries over Kafka and Redis.", no_args_is_help=True)
dev = typer.Typer(
    help="Run the local stack as processes (Kafka, Redis, API pods, batcher, workers, result-router).",
    no_args_is_help=True,
)
app.add_typer(dev, name="dev")
app.add_typer(batch_app, name="batch")
batch_app.command("run")(batch_run)
app.add_typer(bench, name="bench")
app.add_typer(region_app, name="region")
app.command("slo")(slo)
console = make_console()

STATE_DIR = typer.Option(Path("var/dev"), help="Folder for pid files, logs and Kafka data.")


def _stack(
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
    stack = _stack(
        state_dir,
        api_port,
        keys_file,
        tiny_workers=tiny_workers,
        sim_workers=sim_workers,
        sim_batch_time_ms=sim_batch_time_ms,
        kafka_port=kafka_port,
        redis_port=redis_port,
        smollm2_workers=smollm2_workers,
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


@app.command("simulate")
def simulate(
    rps: float = typer.Option(40_000, help="Offered load, requests per second."),
    replicas: int = typer.Option(170, help="Fixed-time batch workers."),
    max_batch: MaxBatch = 64,
    batch_time_ms: BatchTimeMs = 250,
    duration_s: DurationS = 60,
    pattern: str = typer.Option("poisson", help="poisson | bursty (3x the rate for 20% of every 10 s)."),
    wait_ms: int = typer.Option(20, help="Batch wait window of a free fixed-time worker."),
    paid_share: float = typer.Option(1.0, help="Share of paid-tier requests (the rest is free tier)."),
    mix: str = typer.Option(
        "interactive=1", help="Share per traffic class, e.g. interactive=0.8,near_interactive=0.15,deferred=0.05."
    ),
    seed: Seed = 0,
    as_json: AsJson = False,
) -> None:
    """Discrete-event simulation of the batcher's own policy in front of fixed-time batch workers."""
    from llmq_bench.simulate import parse_mix, run_simulation

    try:
        shares = parse_mix(mix)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mix") from exc
    result = run_simulation(
        rps,
        replicas,
        max_batch,
        batch_time_ms,
        duration_s,
        pattern=pattern,
        wait_ms=wait_ms,
        paid_share=paid_share,
        seed=seed,
        mix=shares,
    )
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    latency = result["latency_ms"]
    table = Table(
        "requests",
        "throughput req/s",
        "p50 ms",
        "p99 ms",
        "mean batch fill",
        "utilisation",
        "expired",
        title=f"simulated {duration_s:g}s at {rps:g} req/s on {replicas} replicas "
        f"(wall {result['wall_s']:.1f}s, {result['sim_speed']:.2f}x real time)",
    )
    table.add_row(
        str(result["requests"]),
        f"{result['throughput_rps']:.0f}",
        f"{latency['p50']:.0f}",
        f"{latency['p99']:.0f}",
        f"{result['mean_batch_fill']:.1%}",
        f"{result['utilization']:.1%}",
        str(result["expired"]),
    )
    console.print(table)
    by_class = Table("class", "completed", "p50 ms", "p99 ms", "max ms")
    for key, latency in result["latency_ms_by_class"].items():
        by_class.add_row(
            key,
            str(result["completed_by_class"][key]),
            f"{latency['p50']:.0f}",
            f"{latency['p99']:.0f}",
            str(latency["max"]),
        )
    console.print(by_class)


@app.command("capacity")
def capacity(
    peak_rps: float = typer.Option(40_000, help="Peak offered load, requests per second."),
    max_batch: MaxBatch = 64,
    batch_time_ms: BatchTimeMs = 250,
    p99_target_ms: float = typer.Option(600),
    headroom: float = typer.Option(0.3, help="Share of capacity kept free at peak."),
    spare_replicas: int = typer.Option(1, help="Replicas added so that losing one host stays invisible."),
    duration_s: DurationS = 20,
    as_json: AsJson = False,
) -> None:
    """Closed-form capacity math for fixed-time batch engines, beside the simulated p99 at the planned replica count."""
    from llmq_bench.capacity import capacity_report

    report = capacity_report(
        peak_rps, max_batch, batch_time_ms, headroom, spare_replicas, p99_target_ms=p99_target_ms, duration_s=duration_s
    )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    math, sim = report["math"], report["simulated_at_planned"]
    table = Table("quantity", "closed form", "simulated", title=f"capacity at {peak_rps:g} req/s peak")
    table.add_row("per-replica req/s, full batches", f"{math['per_replica_rps_full_batches']:.0f}", "")
    table.add_row("per-replica req/s, half-full batches", f"{math['per_replica_rps_half_batches']:.0f}", "")
    table.add_row(
        "replicas at 100% (full / half-full)",
        f"{math['replicas_at_100pct_full_batches']} / {math['replicas_at_100pct_half_batches']}",
        "",
    )
    table.add_row(
        f"replicas planned ({headroom:.0%} headroom + {spare_replicas} spare)",
        str(math["replicas_planned"]),
        str(math["replicas_planned"]),
    )
    table.add_row("utilisation at peak", f"{math['utilization_planned']:.1%}", f"{sim['utilization']:.1%}")
    table.add_row(
        "expected queueing delay, ms (mean / p99)",
        f"{math['queue_wait_ms']['mean_ms']:.1f} / {math['queue_wait_ms']['p99_ms']:.1f}",
        "",
    )
    table.add_row(
        "latency, ms (expected / p99 bound)",
        f"{math['expected_latency_ms']:.0f} / {math['p99_latency_bound_ms']:.0f}",
        f"{sim['latency_ms']['mean']:.0f} / {sim['latency_ms']['p99']:.0f}",
    )
    table.add_row("mean batch fill", "", f"{sim['mean_batch_fill']:.1%}")
    verdict = "meets" if sim["latency_ms"]["p99"] <= p99_target_ms else "misses"
    console.print(table)
    console.print(f"simulated p99 {verdict} the {p99_target_ms:g} ms target at {math['replicas_planned']} replicas")


@app.command("topics")
def create_topics(
    acls: bool = typer.Option(
        False,
        help="First create every role's ACLs (a secure cluster, as the admin principal): llmq_core.security's table for "
        "LLMQ_KAFKA_REPLY_TOPIC_PREFIXES, LLMQ_KAFKA_INGRESS and LLMQ_REGION_PEERS, as `llmq dev up --secure` does.",
    ),
) -> None:
    """Create the llmq topics that are missing on the broker named by LLMQ_KAFKA_BOOTSTRAP_SERVERS (and raise the
    max.message.bytes of existing ones to what llmq needs)."""
    settings = load_settings()
    if acls:
        rows = security.settings_acls(settings)
        asyncio.run(security.apply_kafka_acls(settings, rows))
        console.print(f"{len(rows)} ACLs on {settings.kafka.bootstrap_servers}")
    asyncio.run(ensure_topics(settings, raise_limits=True))
    console.print(f"topics ready on {settings.kafka.bootstrap_servers}")


@app.command("prompts")
def make_prompts(
    count: int = typer.Option(300),
    seed: Seed = 0,
    output: Path = typer.Option(Path("var/demo/prompts-code.jsonl"), "-o"),
) -> None:
    """Write code-completion prompts cut from this machine's Python standard library as JSONL."""
    console.print(f"wrote {prompts.write_jsonl(prompts.cut_prompts(count, seed=seed), output)}")


@app.command("demo")
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
    stack = _stack(state_dir, kafka_port=kafka_port, redis_port=redis_port, api_port=api_port)
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


if __name__ == "__main__":
    app()

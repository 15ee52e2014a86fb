"""``llmq bench``: open-loop load against a running stack; ``llmq bench curve``: llmq's capacity curve beside Ray's;
``llmq bench admission``: a burst of free-tier work and admission's predicted waits; ``llmq bench pipeline``: CPU
and latency beside the Kafka + Redis floor; ``llmq bench timeline``: where a light request's time goes; ``llmq bench
scale``: one overload with 1, 2, 3... batchers. The private
stacks the benchmarks run on are made here: ``llmq_bench`` is a library the CLI imports, never the other way round."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmq_bench import prompts as prompts_mod
from llmq_cli.console import make_console
from llmq_cli.devstack import DevStack, StackConfig, service_specs
from llmq_cli.options import BatchTimeMs, MaxBatch, PortBase, Seed, Systems
from llmq_core.constants import STATS_BATCHER
from llmq_core.settings import Settings

bench = typer.Typer(help="Load generator, capacity curve and burst admission.", invoke_without_command=True)
DEFAULT_PROMPTS = Path("var/demo/prompts-code.jsonl")
DEFAULT_BASE_URLS = ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]


def load_prompts(path: Path, count: int = 300) -> list[prompts_mod.CodePrompt]:
    """Prompts from a JSONL file of ``{"prompt", "max_tokens"}`` lines; the demo's default file is cut when missing."""
    if not path.exists() and path == DEFAULT_PROMPTS:
        prompts_mod.write_jsonl(prompts_mod.cut_prompts(count), path)
    found = prompts_mod.read_jsonl(path)
    if not found:
        raise typer.BadParameter(f"no prompts in {path}")
    return found


def run_with_progress(plans: list, console: Console, **kwargs) -> list:
    """:func:`llmq_bench.loadgen.run_load` under a rich progress bar (requests sent, requests answered)."""
    from llmq_bench import loadgen

    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        sent = progress.add_task("sent", total=len(plans))
        done = progress.add_task("answered", total=len(plans))
        return asyncio.run(
            loadgen.run_load(
                plans, on_sent=lambda: progress.advance(sent), on_done=lambda _sample: progress.advance(done), **kwargs
            )
        )


@bench.callback()
def bench_load(
    ctx: typer.Context,
    base_url: list[str] = typer.Option(DEFAULT_BASE_URLS, help="API base URL; repeat for several pods."),
    rate: float = typer.Option(20.0, help="Offered load: mean Poisson arrival rate, requests per second."),
    count: int = typer.Option(600, help="Requests at most."),
    duration_s: float = typer.Option(30.0, help="Arrival window, seconds at most."),
    model: str = typer.Option("llmq-sim"),
    prompts: Path = typer.Option(DEFAULT_PROMPTS, help="JSONL prompts ({prompt, max_tokens}); default: the demo's."),
    classes: str = typer.Option(
        "interactive=0.8,near_interactive=0.15,deferred=0.05", help="Traffic class mix (x-llmq-class), name=weight,..."
    ),
    keys: str = typer.Option("llmq-dev-key=0.8,llmq-dev-free-key=0.2", help="Tenant mix by API key, key=weight,..."),
    stream_share: float = typer.Option(0.3, help="Share of requests sent with stream: true."),
    slo_ms: float = typer.Option(1500.0, help="A success within this end-to-end latency counts toward goodput."),
    timeout_s: float = typer.Option(60.0, help="Client timeout per request."),
    server_timeout_ms: int = typer.Option(0, help="x-llmq-timeout-ms sent with each request (0: none)."),
    redis_url: str = typer.Option("", help="Redis holding the batcher's stats (default LLMQ_REDIS_URL); 'none': skip."),
    stats_key: str = typer.Option(STATS_BATCHER, help="Stats hash with batches/requests counters."),
    max_batch_size: int = typer.Option(64, help="Workers' max batch size, for batch fill."),
    wait_ready_s: float = typer.Option(
        0.0, help="First wait up to this long for every base URL's pod to be ready (/readyz; 0: no)."
    ),
    seed: Seed = 0,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (progress goes to stderr)."),
) -> None:
    """Open-loop Poisson load against running API pods, then goodput, latency and TTFT per class, 429/504, batching."""
    if ctx.invoked_subcommand is not None:
        return
    from llmq_bench import loadgen

    if wait_ready_s:
        asyncio.run(loadgen.wait_ready(base_url, wait_ready_s))
    rng = random.Random(seed)
    arrivals = loadgen.poisson_arrivals(rate, count=count, duration_s=duration_s, rng=rng)
    plans = loadgen.plan_requests(
        load_prompts(prompts),
        arrivals,
        classes=loadgen.parse_weights(classes),
        keys=loadgen.parse_weights(keys),
        stream_share=stream_share,
        base_urls=base_url,
        rng=rng,
    )
    stats_url = None if redis_url == "none" else (redis_url or Settings().redis.url)
    before = loadgen.batch_counts(stats_url, stats_key) if stats_url else None
    samples = run_with_progress(
        plans, make_console(stderr=True), model=model, timeout_s=timeout_s, server_timeout_ms=server_timeout_ms or None
    )
    delta = None
    if before is not None:
        served = sum(s.status == "ok" for s in samples)
        delta = loadgen.batch_delta(lambda: loadgen.batch_counts(stats_url, stats_key), before, served)
    report = loadgen.summarize(
        samples,
        window_s=loadgen.arrival_window_s(arrivals, count, duration_s),
        slo_ms=slo_ms,
        batch_delta=delta,
        max_batch_size=max_batch_size,
    )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        print_report(report, make_console())


def print_report(report: dict, console: Console) -> None:
    """The report as a table: one row for all requests, then one per traffic class."""
    batches = report["batches"]
    batching = (
        f"mean batch {batches['mean_size']:.1f} of {batches['max_batch_size']} (fill {batches['fill']:.0%})"
        if batches
        else "batch stats unavailable"
    )
    table = Table(
        "class",
        "requests",
        "ok",
        "good",
        "429",
        "504",
        "other",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "TTFT p50",
        "TTFT p99",
        title=f"offered {report['offered_rps']:.1f} req/s over {report['window_s']:.1f}s; goodput "
        f"{report['goodput_rps']:.1f} req/s (SLO {report['slo_ms']:g} ms, "
        f"{report['goodput_ratio']:.0%} of offered); {batching}",
    )
    for name, group in [("all", report), *report["classes"].items()]:
        other = group["requests"] - group["succeeded"] - group["rejected_429"] - group["timeouts_504"]
        lat, ttft = group["latency_ms"], group["ttft_ms"]
        table.add_row(
            name,
            str(group["requests"]),
            str(group["succeeded"]),
            str(group["good"]),
            str(group["rejected_429"]),
            str(group["timeouts_504"]),
            str(other),
            f"{lat['p50']:.0f}",
            f"{lat['p95']:.0f}",
            f"{lat['p99']:.0f}",
            f"{ttft['p50']:.0f}",
            f"{ttft['p99']:.0f}",
        )
    console.print(table)
    for detail, count in report["errors"].items():
        console.print(f"[red]{count} x[/red] {detail}")


@bench.command("curve")
def bench_curve(
    systems: Systems = "llmq,ray",
    batch_time_ms: int = typer.Option(0, help="Simulated batch time; 0: derived from the measured saturation."),
    saturation_rps: float = typer.Option(0.0, help="Pipeline saturation throughput; 0: measure it first."),
    workers: int = typer.Option(2, help="Simulated workers (Ray: replicas)."),
    max_batch_size: MaxBatch = 16,
    ray_wait_ms: int = typer.Option(0, help="Ray's batch_wait_timeout_s in ms; 0: the batch time."),
    point_s: float = typer.Option(25.0, help="Arrival window of each load point, seconds."),
    loads: str = typer.Option("0.25,0.5,0.8,0.95,1.1", help="Offered load points, fractions of ideal capacity."),
    output: Path = typer.Option(Path("bench/results/capacity_curve.json"), help="JSON out; the PNG goes beside it."),
    state_dir: Path = typer.Option(Path("var/bench"), help="The private llmq stack's state folder."),
    port_base: PortBase = 35000,
) -> None:
    """Capacity curve of llmq-sim (seed 003 scaled to this machine), llmq then Ray Serve, as JSON and a PNG."""
    from llmq_bench import capacity_curve

    def stack(sim_batch_time_ms: int) -> DevStack:
        ports = dict(kafka_port=port_base + 92, redis_port=port_base + 379, api_ports=(port_base, port_base + 1))
        return private_stack(
            state_dir,
            **ports,
            sim_workers=workers,
            sim_batch_time_ms=sim_batch_time_ms,
            sim_max_batch_size=max_batch_size,
        )

    cfg = capacity_curve.CurveConfig(
        systems=tuple(s.strip() for s in systems.split(",") if s.strip()),
        batch_time_ms=batch_time_ms,
        saturation_rps=saturation_rps,
        ray_wait_ms=ray_wait_ms,
        workers=workers,
        max_batch_size=max_batch_size,
        point_s=point_s,
        loads=tuple(float(x) for x in loads.split(",")),
        output=output,
        state_dir=state_dir,
        port_base=port_base,
    )
    result = capacity_curve.run_curve(cfg, stack, log=make_console(stderr=True).print)
    capacity_curve.print_curve(result, make_console())
    if result.get("failed"):
        raise typer.Exit(1)


def private_stack(state_dir: Path, **shape) -> DevStack:
    """A benchmark's own stack under ``state_dir``: ``llmq-sim`` workers, no transformers worker unless ``shape`` asks."""
    return DevStack(StackConfig(state_dir=state_dir, **{"tiny_workers": 0, **shape}))


@bench.command("admission")
def bench_admission(
    url: list[str] = typer.Option([], help="An API pod's URL (repeat for several); default: --start-stack's."),
    start_stack: bool = typer.Option(
        False, help="Start a private stack (two llmq-sim workers x 64 per 500 ms, two API pods) for the run."
    ),
    batchers: int = typer.Option(1, min=1, help="--start-stack: batcher processes in its consumer group."),
    count: int = typer.Option(3000, help="Requests launched at once."),
    stream_share: float = typer.Option(1 / 3, help="Share of them streamed."),
    max_tokens: int = typer.Option(64),
    key: str = typer.Option("llmq-dev-free-key"),
    model: str = typer.Option("llmq-sim", help="llmq-tiny: --start-stack adds one transformers worker of it."),
    idle_s: float = typer.Option(3.0, min=0, help="Seconds between the warm-up's last answer and the burst."),
    metrics_url: list[str] = typer.Option(
        [], help="An API pod's /metrics base URL (repeat for each pod): adds the pods' prediction verdicts."
    ),
) -> None:
    """N concurrent completions at once, and how well admission's predicted queue wait matched the wait that followed."""
    from llmq_bench import admission

    stack = None
    if start_stack:
        stack = private_stack(
            Path("var/bench-admission"),
            sim_workers=2,
            batchers=batchers,
            tiny_workers=int(model == "llmq-tiny"),
            extra_env=admission.LOAD_GENERATOR_ENV,
            **admission.STACK_PORTS,
        )
        pods = [spec for spec in service_specs(stack.cfg) if spec.kind == "api"]
        metrics_url = metrics_url or [f"http://127.0.0.1:{spec.metrics_port}" for spec in pods]
    urls = url or [f"http://127.0.0.1:{p}" for p in admission.STACK_PORTS["api_ports"]]
    spec = admission.Burst(
        count=count, stream_share=stream_share, max_tokens=max_tokens, key=key, model=model, idle_s=idle_s
    )
    try:
        if stack is not None:
            stack.up(timeout_s=300, log=lambda *_: None)
        report = asyncio.run(admission.run(urls, spec, metrics_url))
    finally:
        if stack is not None:
            stack.down()
    typer.echo(json.dumps(report, indent=2))


# Starts or stops a DevStack of the checkout it runs in (its own python and code): ``python -c SCRIPT up|down CONFIG``.
_CHECKOUT_STACK = """
import json, sys
from pathlib import Path
from llmq_cli.devstack import DevStack, StackConfig, service_specs
cfg = json.loads(sys.argv[2])
stack = DevStack(StackConfig(**{**cfg, "state_dir": Path(cfg["state_dir"]), "api_ports": tuple(cfg["api_ports"])}))
try:
    stack.up(timeout_s=300, log=lambda *_: None) if sys.argv[1] == "up" else stack.down()
except RuntimeError as exc:  # not healthy: which process, why, where its logs are
    sys.exit(str(exc))
"""


class CheckoutStack:
    """A private stack of ``llmq-sim`` workers run from ``checkout`` (its ``.venv``; default: this process's python
    and code), so a run can measure another commit's services beside this one's."""

    def __init__(self, checkout: Path | None, state_dir: Path, port_base: int, **shape) -> None:
        self.python = str(checkout / ".venv/bin/python") if checkout else sys.executable
        self.cwd = checkout
        self.state_dir = state_dir.resolve()
        self.config = dict(
            state_dir=str(self.state_dir),
            kafka_port=port_base + 92,
            redis_port=port_base + 379,
            api_ports=[port_base, port_base + 1],
            tiny_workers=0,
            **shape,
        )
        self.base_urls = [f"http://127.0.0.1:{p}/v1" for p in self.config["api_ports"]]
        self.kafka_bootstrap = f"127.0.0.1:{port_base + 92}"
        self.redis_url = f"redis://127.0.0.1:{port_base + 379}/0"

    def _run(self, action: str) -> None:
        subprocess.run([self.python, "-c", _CHECKOUT_STACK, action, json.dumps(self.config)], cwd=self.cwd, check=True)

    def up(self) -> None:
        """Start it; one that does not come up healthy (the child printed why) is stopped again and the command ends
        with exit code 1, leaving no process behind."""
        try:
            self._run("up")
        except subprocess.CalledProcessError:
            self.down()
            raise typer.Exit(1) from None

    def down(self) -> None:
        self._run("down")

    def pids(self) -> dict[str, int]:
        return {p.stem: json.loads(p.read_text())["pid"] for p in sorted((self.state_dir / "pids").glob("*.json"))}


@bench.command("pipeline")
def bench_pipeline(
    systems: Systems = "llmq,ray",
    baseline: Path = typer.Option(None, help="Another checkout (with its own .venv) measured the same way, first."),
    requests: int = typer.Option(2000, min=1, help="Requests measured at saturation (after --warmup more)."),
    light_requests: int = typer.Option(500, min=1, help="Requests measured at 1 in flight."),
    warmup: int = typer.Option(200, min=0, help="Unmeasured requests before each point."),
    concurrency: int = typer.Option(64, min=1, help="In flight at saturation (closed loop)."),
    floor_messages: int = typer.Option(500, min=1, help="Messages of each floor hop (Kafka, Redis)."),
    batch_time_ms: BatchTimeMs = 5,
    output: Path = typer.Option(Path("bench/results/pipeline.json"), help="JSON out."),
    state_dir: Path = typer.Option(Path("var/bench-pipeline"), help="The private stacks' state folders (under it)."),
    port_base: PortBase = 36000,
    profile_dir: Path = typer.Option(
        None, help="py-spy profiles of every service at saturation here (summaries in JSON)."
    ),
) -> None:
    """The Kafka + Redis floor, llmq at 1 and at --concurrency in flight, and Ray Serve at the same points: latency,
    overhead, throughput and CPU ms per request per process (broker included), side by side, as JSON and a table."""
    from llmq_bench import pipeline

    cfg = pipeline.PipelineConfig(
        requests=requests,
        light_requests=light_requests,
        warmup=warmup,
        concurrency=concurrency,
        floor_messages=floor_messages,
        peer=replace(pipeline.PipelineConfig.peer, batch_time_ms=batch_time_ms, port=port_base + 500),
    )
    console = make_console(stderr=True)
    chosen = [s.strip() for s in systems.split(",") if s.strip()]
    runs = ([("baseline", baseline)] if baseline else []) + ([("llmq", None)] if "llmq" in chosen else [])
    result: dict = {"config": {**asdict(cfg), "baseline": str(baseline) if baseline else None}, "systems": {}}
    for name, checkout in runs:
        stack = CheckoutStack(
            checkout,
            state_dir / name,
            port_base,
            sim_workers=cfg.peer.replicas,
            sim_batch_time_ms=cfg.peer.batch_time_ms,
            sim_max_batch_size=cfg.peer.max_batch_size,
            extra_env={"LLMQ_BATCHER_FIXED_ENGINE_MAX_WAIT_MS": "0"},
        )
        console.print(f"{name}: starting its stack ({checkout or 'this checkout'})")
        stack.up()
        try:
            profiles = profile_dir / name if profile_dir else None
            result["systems"][name] = pipeline.measure_llmq(stack, cfg, console.print, profiles)
        finally:
            stack.down()
    if "ray" in chosen:
        console.print("ray: starting Ray Serve")
        result["systems"]["ray"] = pipeline.measure_ray(cfg, console.print)
    if "llmq" in result["systems"]:
        llmq = result["systems"]["llmq"]
        result["goals"] = pipeline.goals(
            llmq, llmq["floor"], result["systems"].get("baseline"), result["systems"].get("ray")
        )
    pipeline.write_result(result, output)
    print_pipeline(result, make_console())


def print_pipeline(result: dict, console: Console) -> None:
    """One row per system and point: latency, overhead, throughput, CPU per request (the broker's apart), the load
    generator's CPU per request and how busy the whole machine was."""
    table = Table(
        "system",
        "in flight",
        "p50 ms",
        "p99 ms",
        "overhead p50",
        "overhead p99",
        "req/s",
        "CPU ms/req",
        "broker",
        "load gen",
        "machine busy",
    )
    for name, run in result["systems"].items():
        if "floor" in run:
            floor = run["floor"]
            table.add_row(f"{name} floor", "1", f"{floor['p50_ms']:.2f}", f"{floor['p99_ms']:.2f}", *[""] * 7)
        for point in (run["light"], run["saturation"]):
            cpu = point["cpu"]
            table.add_row(
                name,
                str(point["concurrency"]),
                f"{point['e2e_p50_ms']:.2f}",
                f"{point['e2e_p99_ms']:.2f}",
                f"{point['overhead_p50_ms']:.2f}",
                f"{point['overhead_p99_ms']:.2f}",
                f"{point['throughput_rps']:.1f}",
                f"{cpu['total_ms']:.2f}",
                f"{cpu['per_process_ms'].get('kafka', 0):.2f}",
                f"{point['loadgen_cpu_ms_per_request']:.2f}",
                f"{point['machine_busy_fraction']:.0%}",
            )
    console.print(table)
    for goal, value in result.get("goals", {}).items():
        console.print(f"{goal}: {value}")


@bench.command("timeline")
def bench_timeline(
    requests: int = typer.Option(300, min=1, help="Requests measured, one at a time (after --warmup more)."),
    warmup: int = typer.Option(50, min=0, help="Unmeasured requests first."),
    batch_time_ms: BatchTimeMs = 5,
    output: Path = typer.Option(Path("bench/results/light_timeline.json"), help="JSON out."),
    state_dir: Path = typer.Option(Path("var/bench-timeline"), help="The private stack's state folder."),
    port_base: PortBase = 37000,
) -> None:
    """Where a request's time goes at 1 in flight: median span starts and ends after the API pod's server span, from
    a private stack (as ``llmq bench pipeline``'s) that traces to files."""
    from llmq_bench import light_timeline, pipeline

    cfg = replace(pipeline.PipelineConfig(), light_requests=requests, warmup=warmup)
    trace_dir = state_dir.resolve() / "traces"
    shutil.rmtree(trace_dir, ignore_errors=True)
    env = {**light_timeline.tracing_env(trace_dir), "LLMQ_BATCHER_FIXED_ENGINE_MAX_WAIT_MS": "0"}
    stack = CheckoutStack(
        None, state_dir, port_base, sim_workers=cfg.peer.replicas, sim_batch_time_ms=batch_time_ms, extra_env=env
    )
    stack.up()
    try:
        latencies, failures, since_ns = light_timeline.drive(stack.base_urls[0], cfg)
    finally:
        stack.down()  # its exporters flush at exit
    spans = light_timeline.read_spans(trace_dir)
    result = light_timeline.result(latencies, failures, spans, since_ns, engine_ms=batch_time_ms)
    pipeline.write_result(result, output)
    console = make_console()
    console.print(f"wrote {output}")
    console.print(
        f"end to end p50 {result['e2e_p50_ms']:.2f} ms, p99 {result['e2e_p99_ms']:.2f} ms ({failures} failed)"
    )
    table = Table("span", "count", "start p50 ms", "end p50 ms")
    for row in result["spans"]:
        table.add_row(row["span"], str(row["count"]), f"{row['start_p50_ms']:.2f}", f"{row['end_p50_ms']:.2f}")
    console.print(table)


@bench.command("scale")
def bench_scale(
    batchers: str = typer.Option("1,2,3", help="Batcher counts, one private stack each (as many result-routers)."),
    rate: float = typer.Option(380.0, help="Offered load: mean Poisson arrival rate, requests per second."),
    count: int = typer.Option(11_400, help="Requests at most per run."),
    duration_s: float = typer.Option(30.0, help="Arrival window per run, seconds at most."),
    warmup: int = typer.Option(100, min=0, help="Paid requests (50/s) before each run, unmeasured; 0: none."),
    seed: Seed = 7,
    output: Path = typer.Option(Path("bench/results/scale.json"), help="JSON out."),
    state_dir: Path = typer.Option(Path("var/bench-scale"), help="The private stacks' state folders (under it)."),
    port_base: PortBase = 32100,  # below the ephemeral range (32768+): the load generator's connections never take one
    feeds: str = typer.Option(
        "http", help="What loads each stack, in turn: http (through the API pods), kafka (the batcher alone)."
    ),
) -> None:
    """Issue 28's overload (interactive, half paid and half free, none streamed) on two llmq-sim workers (256 req/s)
    with 1, 2, 3... batchers: paid and free outcomes, goodput, batch fill, CPU per request per process kind, and each
    count against the first. --feeds http,kafka also feeds the same arrivals straight to Kafka (interactive, paid):
    the batcher's CPU per request alone."""
    from llmq_bench import admission, scale

    counts = tuple(int(x) for x in batchers.split(",") if x.strip())
    if not counts or min(counts) < 1:
        raise typer.BadParameter("want counts >= 1, e.g. 1,2,3", param_hint="--batchers")
    chosen = tuple(x.strip() for x in feeds.split(",") if x.strip())
    if not chosen or not set(chosen) <= set(scale.FEEDS):
        raise typer.BadParameter(f"want some of {', '.join(scale.FEEDS)}, e.g. http,kafka", param_hint="--feeds")
    cfg = scale.ScaleConfig(
        batchers=counts,
        rate=rate,
        count=count,
        duration_s=duration_s,
        warmup=warmup,
        seed=seed,
        output=output,
        feeds=chosen,
    )
    api_ports = (port_base, port_base + 1)

    def stack_for(n: int) -> DevStack:
        folder = state_dir / f"batchers-{n}"
        shutil.rmtree(folder, ignore_errors=True)  # a fresh Kafka and Redis per count: no backlog of an earlier run
        return private_stack(
            folder,
            kafka_port=port_base + 92,
            redis_port=port_base + 379,
            api_ports=api_ports,
            sim_workers=cfg.sim_workers,
            sim_batch_time_ms=cfg.sim_batch_time_ms,
            sim_max_batch_size=cfg.sim_max_batch_size,
            batchers=n,
            routers=n,
            extra_env=admission.LOAD_GENERATOR_ENV,  # the load's thousands of waiting connections come from one address
        )

    base_urls = [f"http://127.0.0.1:{port}/v1" for port in api_ports]
    result = scale.run_scale(cfg, stack_for, load_prompts(DEFAULT_PROMPTS), base_urls, make_console(stderr=True).print)
    print_scale(result, make_console())


def print_scale(result: dict, console: Console) -> None:
    """One row per batcher count, then each count against the first, then the goals."""
    table = Table(
        "batchers",
        "paid ok / in SLO",
        "paid p50 / p99 ms",
        "paid 429 / 504",
        "free ok / 429 / 504",
        "goodput",
        "throughput",
        "fill",
        "CPU ms/req (api bat wrk rtr kafka)",
        "req/s/core (bat rtr)",
        title="llmq bench scale: req/s; goodput within the SLO; CPU per answered request",
    )
    short = ("api", "batcher", "worker", "result-router", "kafka")
    for run in result["runs"]:
        if run.get("feed", "http") != "http":
            continue
        r = run["row"]
        cpu, per_core = r["cpu_ms_per_request"], r["requests_per_s_per_core"]
        table.add_row(
            str(r["batchers"]),
            f"{r['paid_answered']} / {r['paid_within_slo']}",
            f"{r['paid_p50_ms']:.0f} / {r['paid_p99_ms']:.0f}",
            f"{r['paid_429']} / {r['paid_504']}",
            f"{r['free_answered']} / {r['free_429']} / {r['free_504']}",
            f"{r['goodput_rps']:.1f}",
            f"{r['throughput_rps']:.1f}",
            "" if r["batch_fill"] is None else f"{r['batch_fill']:.0%}",
            " ".join(f"{cpu.get(kind, 0):.2f}" for kind in short),
            " ".join(f"{per_core.get(kind) or 0:.0f}" for kind in ("batcher", "result-router")),
        )
    console.print(table)
    for entry in result["ratios"]:
        figures = ", ".join(
            f"{name} x{value:.2f}" for name, value in entry.items() if isinstance(value, float) and name != "batchers"
        )
        console.print(f"{entry['batchers']} against {entry['against']} batcher(s): {figures}")
    for goal in result["goals"]:
        console.print(
            f"goals, {goal['batchers']} batcher(s): {', '.join(f'{k} {v}' for k, v in goal.items() if k != 'batchers')}"
        )
    direct = [run["row"] for run in result["runs"] if run.get("feed") == "kafka"]
    if direct:
        print_direct(direct, console)


def print_direct(rows: list[dict], console: Console) -> None:
    """The Kafka-fed runs: the batcher alone (no API pod or HTTP load generator on the path)."""
    table = Table(
        "batchers",
        "answered / sent",
        "offered / answered req/s",
        "p50 / p99 ms",
        "CPU ms/req (bat wrk rtr kafka)",
        "batcher req/s/core",
        title="fed straight to Kafka: the batcher alone",
    )
    short = ("batcher", "worker", "result-router", "kafka")
    for r in rows:
        cpu = r["cpu_ms_per_request"]
        table.add_row(
            str(r["batchers"]),
            f"{r['answered']} / {r['requests']}",
            f"{r['offered_rps']:.1f} / {r['throughput_rps']:.1f}",
            f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}",
            " ".join(f"{cpu.get(kind, 0):.2f}" for kind in short),
            f"{r['requests_per_s_per_core'].get('batcher') or 0:.0f}",
        )
    console.print(table)


@bench.command("prefix")
def bench_prefix(
    engine: str = typer.Option("sim", help="sim (llmq-sim with a prefill term) or real (smollm2-135m-instruct)."),
    workers: int = typer.Option(4, min=1, help="Workers of the engine."),
    headers: int = typer.Option(30, min=1, help="Editing sessions (one file header each)."),
    cursors: int = typer.Option(10, min=1, help="Prompts per session."),
    rate: float = typer.Option(12.0, help="Offered load: mean Poisson arrival rate, requests per second."),
    slo_ms: float = typer.Option(2000.0, help="A succeeded request within this (ms, end to end) is good."),
    prefill_ms_per_token: float = typer.Option(0.1, help="sim: prefill ms per uncached prompt token."),
    seed: Seed = 7,
    output: Path = typer.Option(None, help="JSON out (default bench/results/prefix-<engine>.json)."),
    state_dir: Path = typer.Option(Path("var/bench-prefix"), help="The private stack's state folder."),
    port_base: PortBase = 32300,
) -> None:
    """Prefix-aware dispatch against least-loaded on interleaved editing sessions (every prompt streamed): prefix hit
    rate, TTFT, throughput, goodput per class and shedding per mode, each worker's prefix cache holding about 1/N of
    the sessions' headers."""
    from llmq_bench import admission, prefix_bench
    from llmq_core.token_counts import counter_of, load_counters

    if engine not in prefix_bench.ENGINES:
        raise typer.BadParameter(f"want one of {', '.join(prefix_bench.ENGINES)}", param_hint="--engine")
    cfg = prefix_bench.PrefixBenchConfig(
        engine=engine,
        workers=workers,
        headers=headers,
        cursors=cursors,
        rate=rate,
        slo_ms=slo_ms,
        prefill_ms_per_token=prefill_ms_per_token,
        seed=seed,
        output=output or Path(f"bench/results/prefix-{engine}.json"),
    )
    prompts = prompts_mod.session_prompts(headers, cursors, seed=seed)
    counter = counter_of(load_counters(Settings()), cfg.model)
    header_tokens = [counter.prompt(h) for h in sorted({prefix_bench.header_of(p) for p in prompts})]
    api_ports = (port_base, port_base + 1)
    shutil.rmtree(state_dir, ignore_errors=True)
    shape = {"sim_workers": 0, "smollm2_workers": 0}
    shape["sim_workers" if engine == "sim" else "smollm2_workers"] = workers

    def stack_for(mode: str, budget: int) -> DevStack:
        env = {
            **admission.LOAD_GENERATOR_ENV,
            "LLMQ_BATCHER_PREFIX_ROUTING": str(mode == "prefix").lower(),
            "LLMQ_WORKER_PREFIX_CACHE_BUDGET_TOKENS": str(budget),
        }
        return private_stack(
            state_dir,
            kafka_port=port_base + 92,
            redis_port=port_base + 379,
            api_ports=api_ports,
            sim_batch_time_ms=cfg.sim_batch_time_ms,
            sim_max_batch_size=cfg.sim_max_batch_size,
            sim_worker_args=("--prefill-ms-per-token", str(prefill_ms_per_token)),
            extra_env=env,
            **shape,
        )

    base_urls = [f"http://127.0.0.1:{port}/v1" for port in api_ports]
    try:
        result = prefix_bench.run_prefix(
            cfg, stack_for, prompts, header_tokens, base_urls, make_console(stderr=True).print
        )
    finally:
        stack_for("prefix", 0).down()
    print_prefix(result, make_console())


def print_prefix(result: dict, console: Console) -> None:
    """One row per routing mode, then the comparison."""
    sessions = result["sessions"]
    table = Table(
        "routing",
        "hit rate",
        "TTFT p50 / p90 / p99 ms",
        "latency p50 / p99 ms",
        "throughput",
        "goodput",
        "429 / 503",
        "decisions",
        title=(
            f"llmq bench prefix: {result['config']['workers']} {result['config']['model']} workers,"
            f" {sessions['headers']} sessions x {sessions['cursors']}, working set / one worker's cache"
            f" {sessions['working_set_ratio']}"
        ),
    )
    for r in result["rows"]:
        ttft, latency = r["ttft_ms"], r["latency_ms"]
        table.add_row(
            r["mode"],
            f"{r['hit_rate']:.0%}",
            f"{ttft['p50']:.0f} / {ttft['p90']:.0f} / {ttft['p99']:.0f}",
            f"{latency['p50']:.0f} / {latency['p99']:.0f}",
            f"{r['throughput_rps']:.2f}",
            f"{r['goodput_rps']:.2f}",
            f"{r['share_429']:.1%} / {r['share_503']:.1%}",
            " ".join(f"{k} {v}" for k, v in sorted(r["decisions"].items())),
        )
    console.print(table)
    if result["comparison"]:
        console.print(f"prefix-aware against least-loaded: {result['comparison']}")

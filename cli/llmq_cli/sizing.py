"""``llmq simulate`` and ``llmq capacity``: the batcher's policy in a discrete-event simulation, and the closed-form
capacity math for batch engines (fixed time, or prefill per uncached prompt token) beside it, with the fleet around the
replicas (docs/simulator.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from llmq_bench.batch_time import DEFAULT_PREFILL_MS_PER_TOKEN, BatchTimeModel
from llmq_cli.console import make_console
from llmq_cli.options import (
    AsJson,
    BatchTimeMs,
    DurationS,
    MaxBatch,
    PrefillMsPerToken,
    PrefixHitRate,
    PrefixTokens,
    PromptTokens,
    Seed,
)

console = make_console()


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
    batchers: int = typer.Option(1, min=1, help="Batchers of one group, each with its partitions' share of arrivals."),
    shared_capacity: bool = typer.Option(
        True, help="Claim each batch from its worker's ledger, with the class leads of LLMQ_BATCHER_* (the default)."
    ),
    prompt_tokens: PromptTokens = 0,
    prefill_ms_per_token: PrefillMsPerToken = DEFAULT_PREFILL_MS_PER_TOKEN,
    prefix_tokens: PrefixTokens = 0,
    prefix_hit_rate: PrefixHitRate = 0.0,
    seed: Seed = 0,
    as_json: AsJson = False,
) -> None:
    """Discrete-event simulation of the batcher's own policy in front of fixed-time batch workers (or workers whose
    batches take prefill time per uncached prompt token: --prompt-tokens)."""
    from llmq_bench.simulate import parse_mix, run_simulation

    try:
        shares = parse_mix(mix)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mix") from exc
    model = batch_time_model(batch_time_ms, prompt_tokens, prefill_ms_per_token, prefix_tokens, prefix_hit_rate)
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
        batchers=batchers,
        batch_time=model,
        **_capacity(shared_capacity),
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
        "mean batch ms",
        title=f"simulated {duration_s:g}s at {rps:g} req/s on {replicas} replicas, {batchers} batcher(s) "
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
        f"{result['mean_window_ms']:.0f}",
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
    stages = result["wait_ms_by_stage"]
    console.print(
        "wait p50 / p99 ms: in the batchers "
        f"{stages['batcher']['p50']:.0f} / {stages['batcher']['p99']:.0f}, "
        f"in the workers' queues {stages['worker']['p50']:.0f} / {stages['worker']['p99']:.0f}"
    )


def batch_time_model(
    batch_time_ms: float, prompt_tokens: int, prefill_ms_per_token: float, prefix_tokens: int, prefix_hit_rate: float
) -> BatchTimeModel | None:
    """The batch-time model of the flags; None when it is the fixed time of --batch-time-ms (no --prompt-tokens).
    typer.BadParameter on settings that make no model."""
    try:
        model = BatchTimeModel(batch_time_ms, prefill_ms_per_token, prompt_tokens, prefix_tokens, prefix_hit_rate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    return None if model.fixed else model


def _capacity(shared: bool) -> dict:
    """The simulation's fleet-wide scheduling: the batcher settings' (llmq simulate's default), or none."""
    if not shared:
        return {}
    from llmq_core.settings import Settings

    batcher = Settings().batcher
    return dict(
        shared_capacity=True, leads_ms=tuple(batcher.fixed_engine_leads_ms), margin_ms=batcher.dispatch_margin_ms
    )


def capacity(
    peak_rps: float = typer.Option(40_000, help="Peak offered load, requests per second."),
    max_batch: MaxBatch = 64,
    batch_time_ms: BatchTimeMs = 250,
    p99_target_ms: float = typer.Option(600),
    headroom: float = typer.Option(0.3, help="Share of capacity kept free at peak."),
    spare_replicas: int = typer.Option(1, help="Replicas added so that losing one host stays invisible."),
    duration_s: DurationS = 20,
    prompt_tokens: PromptTokens = 0,
    prefill_ms_per_token: PrefillMsPerToken = DEFAULT_PREFILL_MS_PER_TOKEN,
    prefix_tokens: PrefixTokens = 0,
    prefix_hit_rate: PrefixHitRate = 0.0,
    simulated: bool = typer.Option(True, "--simulate/--no-simulate", help="Simulate the planned replica count too."),
    cpu_profile: Path = typer.Option(
        None,
        help="`llmq bench scale` JSON of CPU ms per request per process kind (default: bench/results/scale-profile.json).",
    ),
    broker_cores: float = typer.Option(8.0, help="Cores of one Kafka broker."),
    replication_factor: int = typer.Option(3, help="Replicas of each llmq topic on the production cluster."),
    prompt_bytes: int = typer.Option(1500, help="Prompt bytes per request (the records' sizes)."),
    completion_bytes: int = typer.Option(128, help="Completion bytes per request (the results' size)."),
    as_json: AsJson = False,
) -> None:
    """Closed-form capacity math for batch engines (fixed time, or prefill per uncached prompt token), beside the
    simulated p99 at the planned replica count, and the fleet around them: API pods, batchers, result-routers, Redis,
    brokers and topic partitions from CPU ms per request per process kind."""
    from llmq_bench.capacity import capacity_report, record_bytes

    model = batch_time_model(batch_time_ms, prompt_tokens, prefill_ms_per_token, prefix_tokens, prefix_hit_rate)
    try:
        report = capacity_report(
            peak_rps,
            max_batch,
            batch_time_ms,
            headroom,
            spare_replicas,
            p99_target_ms=p99_target_ms,
            simulate=simulated,
            duration_s=duration_s,
            batch_time=model,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    profile = _cpu_profile(cpu_profile)
    if profile:
        report["cpu_profile"] = profile
        if min(prompt_bytes, completion_bytes) < 0:
            raise typer.BadParameter("--prompt-bytes and --completion-bytes must be >= 0")
        report["fleet"] = _fleet(
            report["math"],
            profile,
            headroom=headroom,
            broker_cores=broker_cores,
            replication_factor=replication_factor,
            record=record_bytes(prompt_bytes, completion_bytes, max_batch),
        )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_capacity(report, peak_rps, headroom, spare_replicas, p99_target_ms)


def _cpu_profile(path: Path | None) -> dict | None:
    """The CPU profile of ``path`` (None: the committed DEFAULT_CPU_PROFILE when it is here, else no profile)."""
    from llmq_bench.capacity import DEFAULT_CPU_PROFILE, cpu_profile

    if path is None:
        path = Path(DEFAULT_CPU_PROFILE)
        if not path.exists():
            return None
    try:
        return cpu_profile(json.loads(path.read_text()), str(path))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise typer.BadParameter(str(exc), param_hint="--cpu-profile") from exc


def _fleet(math: dict, profile: dict, **options) -> dict:
    """The fleet plan around the planned replicas (``options``: fleet_plan's), the deployed partitions being those
    of the settings (LLMQ_KAFKA_*_PARTITIONS)."""
    from llmq_bench.capacity import CONSUMED_BY, fleet_plan
    from llmq_core.settings import Settings

    kafka = Settings().kafka
    counts = (kafka.request_topic_partitions, kafka.batch_topic_partitions, kafka.results_topic_partitions)
    try:
        return fleet_plan(
            math["rps"],
            profile["cpu_ms_per_request"],
            replicas=math["replicas_planned"],
            deployed_partitions=dict(zip(CONSUMED_BY, counts, strict=True)),
            **options,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _print_capacity(report: dict, peak_rps: float, headroom: float, spare: int, p99_target_ms: float) -> None:
    math, sim = report["math"], report.get("simulated_at_planned")
    table = Table("quantity", "closed form", "simulated", title=f"capacity at {peak_rps:g} req/s peak")
    rows = [
        (
            "batch time, ms (a full batch)",
            f"{math['batch_time_ms_full_batch']:.0f}",
            _sim(sim, "mean_window_ms", "{:.0f}"),
        ),
        ("per-replica req/s, full batches", f"{math['per_replica_rps_full_batches']:.0f}", ""),
        ("per-replica req/s, half-full batches", f"{math['per_replica_rps_half_batches']:.0f}", ""),
        (
            "replicas at 100% (full / half-full)",
            f"{math['replicas_at_100pct_full_batches']} / {math['replicas_at_100pct_half_batches']}",
            "",
        ),
        (f"replicas planned ({headroom:.0%} headroom + {spare} spare)", str(math["replicas_planned"]), ""),
        ("utilisation at peak", f"{math['utilization_planned']:.1%}", _sim(sim, "utilization", "{:.1%}")),
        (
            "expected queueing delay, ms (mean / p99)",
            f"{math['queue_wait_ms']['mean_ms']:.1f} / {math['queue_wait_ms']['p99_ms']:.1f}",
            "",
        ),
        (
            "latency, ms (expected / p99 bound)",
            f"{math['expected_latency_ms']:.0f} / {math['p99_latency_bound_ms']:.0f}",
            f"{sim['latency_ms']['mean']:.0f} / {sim['latency_ms']['p99']:.0f}" if sim else "",
        ),
        ("largest batch within the p99 target", str(math["max_batch_within_target"]), ""),
        ("mean batch fill", "", _sim(sim, "mean_batch_fill", "{:.1%}")),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    model = math["batch_time_model"]
    if model["mode"] == "prefill":
        console.print(
            f"batch time = {model['fixed_ms']:g} ms + {model['prefill_ms_per_token']:g} ms x uncached prompt tokens "
            f"({model['mean_uncached_tokens']:g} per request: {model['prompt_tokens']} tokens, a {model['prefix_hit_rate']:.0%} "
            f"hit on a {model['prefix_tokens']}-token header); prefill figure {model['prefill_source']}"
        )
    if sim:
        verdict = "meets" if sim["latency_ms"]["p99"] <= p99_target_ms else "misses"
        console.print(f"simulated p99 {verdict} the {p99_target_ms:g} ms target at {math['replicas_planned']} replicas")
    if "fleet" in report:
        from llmq_cli.fleet_table import print_fleet

        print_fleet(console, report["fleet"], report["cpu_profile"])


def _sim(sim: dict | None, key: str, spec: str) -> str:
    return spec.format(sim[key]) if sim else ""

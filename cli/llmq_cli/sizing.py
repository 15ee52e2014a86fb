"""``llmq simulate`` and ``llmq capacity``: the batcher's policy in a discrete-event simulation, and the closed-form
capacity math for fixed-time batch engines beside it (docs/simulator.md)."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from llmq_cli.console import make_console
from llmq_cli.options import AsJson, BatchTimeMs, DurationS, MaxBatch, Seed

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
        batchers=batchers,
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

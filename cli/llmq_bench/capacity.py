"""Capacity math for fixed-time batch engines (seed 003), in closed form, with the simulated p99 beside it.

One replica runs a batch of up to ``max_batch`` requests in ``batch_time_ms``, so its throughput is
``max_batch / batch_time`` for full batches and half that for half-full ones. Queueing for a free replica is modelled as
M/D/c with batches as the customers (Erlang C for the chance to wait; the deterministic service halves M/M/c's wait).

Run: ``llmq capacity --peak-rps 40000 --max-batch 64 --batch-time-ms 250 --p99-target-ms 600 --headroom 0.3``.
"""

from __future__ import annotations

import math

from llmq_bench.simulate import run_simulation


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with ``servers`` and ``offered_load`` = lambda / mu
    (Erlangs). 1.0 when the load reaches the servers (unstable)."""
    if offered_load >= servers:
        return 1.0
    blocking = 1.0  # Erlang B by its stable recurrence
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    rho = offered_load / servers
    return blocking / (1 - rho * (1 - blocking))


def queueing_delay(rps: float, replicas: int, max_batch: int, batch_time_ms: float) -> dict:
    """Wait for a free replica (ms), batches as customers: {p_wait, mean_ms, p99_ms}; inf when overloaded.
    p99 uses M/M/c's exponential tail, an upper bound for deterministic service."""
    batches_per_s = rps / max_batch
    service_s = batch_time_ms / 1000
    offered = batches_per_s * service_s
    p_wait = erlang_c(replicas, offered)
    spare_rate = replicas / service_s - batches_per_s  # batches/s the fleet can serve beyond the load
    if spare_rate <= 0:
        return {"p_wait": 1.0, "mean_ms": math.inf, "p99_ms": math.inf}
    mean_ms = 0.5 * p_wait / spare_rate * 1000
    p99_ms = max(math.log(p_wait / 0.01), 0.0) / spare_rate * 1000 if p_wait > 0.01 else 0.0
    return {"p_wait": round(p_wait, 6), "mean_ms": round(mean_ms, 3), "p99_ms": round(p99_ms, 3)}


def capacity_math(
    rps: float = 40_000,
    max_batch: int = 64,
    batch_time_ms: float = 250,
    headroom: float = 0.3,
    spare_replicas: int = 1,
    wait_ms: float = 20,
    network_ms: float = 0,
    p99_target_ms: float = 600,
) -> dict:
    """Closed-form capacity plan. ``headroom``: share of capacity kept free for bursts (0.3: run at <= 70%);
    ``spare_replicas``: added on top so losing a host keeps the plan (N+1). Returns a dict of throughputs (req/s),
    replica counts, utilisation and expected latency parts (ms)."""
    full = max_batch * 1000 / batch_time_ms
    half = full / 2
    minimum = math.ceil(rps / full)
    planned = math.ceil(rps / (full * (1 - headroom))) + spare_replicas
    fill_ms = (max_batch - 1) / (2 * rps / 1000)  # mean wait for the rest of one's batch to arrive
    queue = queueing_delay(rps, planned, max_batch, batch_time_ms)
    return {
        "rps": rps,
        "per_replica_rps_full_batches": full,
        "per_replica_rps_half_batches": half,
        "replicas_at_100pct_full_batches": minimum,
        "replicas_at_100pct_half_batches": math.ceil(rps / half),
        "replicas_planned": planned,
        "utilization_planned": round(rps / (planned * full), 4),
        "batch_fill_wait_ms": round(min(fill_ms, wait_ms), 3),
        "queue_wait_ms": queue,
        "expected_latency_ms": round(network_ms + min(fill_ms, wait_ms) + queue["mean_ms"] + batch_time_ms, 3),
        "p99_latency_bound_ms": round(network_ms + wait_ms + queue["p99_ms"] + batch_time_ms, 3),
        "latency_bound_with_a_free_replica_ms": network_ms + wait_ms + batch_time_ms,  # low load: window + one batch
        "p99_target_ms": p99_target_ms,
    }


def min_replicas_for_p99(
    rps: float,
    p99_target_ms: float = 600,
    max_batch: int = 64,
    batch_time_ms: int = 250,
    duration_s: float = 20,
    network_ms: int = 0,
    **sim_options,
) -> dict:
    """The fewest replicas whose simulated p99 (plus ``network_ms``) stays under ``p99_target_ms`` with nothing
    expired, by bisection from the full-batch minimum. Returns {replicas, simulation}."""

    def meets(replicas: int) -> dict | None:
        result = run_simulation(
            rps, replicas, max_batch, batch_time_ms, duration_s, network_ms=network_ms, **sim_options
        )
        ok = result["expired"] == 0 and result["latency_ms"]["p99"] is not None
        return result if ok and result["latency_ms"]["p99"] < p99_target_ms else None

    low = math.ceil(rps * batch_time_ms / (1000 * max_batch)) - 1  # below full-batch capacity: never meets
    high = low + 1
    best = meets(high)
    while best is None:
        low, high = high, high * 2
        best = meets(high)
    while high - low > 1:
        middle = (low + high) // 2
        result = meets(middle)
        if result is None:
            low = middle
        else:
            high, best = middle, result
    return {"replicas": high, "simulation": best}


def capacity_report(
    rps: float = 40_000,
    max_batch: int = 64,
    batch_time_ms: int = 250,
    headroom: float = 0.3,
    spare_replicas: int = 1,
    wait_ms: int = 20,
    network_ms: int = 0,
    p99_target_ms: float = 600,
    simulate: bool = True,
    duration_s: float = 20,
    search: bool = False,
    **sim_options,
) -> dict:
    """:func:`capacity_math` with the simulated result at the planned replica count beside it (``simulate``), and
    optionally the fewest replicas that meet the p99 target in simulation (``search``: several runs)."""
    report = {
        "math": capacity_math(
            rps, max_batch, batch_time_ms, headroom, spare_replicas, wait_ms, network_ms, p99_target_ms
        )
    }
    if simulate:
        planned = report["math"]["replicas_planned"]
        report["simulated_at_planned"] = run_simulation(
            rps, planned, max_batch, batch_time_ms, duration_s, wait_ms=wait_ms, network_ms=network_ms, **sim_options
        )
    if search:
        report["min_replicas_for_p99"] = min_replicas_for_p99(
            rps, p99_target_ms, max_batch, batch_time_ms, duration_s, network_ms, wait_ms=wait_ms, **sim_options
        )
    return report

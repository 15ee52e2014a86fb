"""Capacity math for batch engines (seed 003), in closed form, with the simulated p99 beside it, and the fleet around
them.

One replica runs a batch of up to ``max_batch`` requests in ``batch_time_ms``, so its throughput is
``max_batch / batch_time`` for full batches and half that for half-full ones. With a prefill term
(:class:`llmq_bench.batch_time.BatchTimeModel`) a batch's time grows with its requests' uncached prompt tokens, and a
half-full batch is quicker than a full one. Queueing for a free replica is modelled as M/D/c with batches as the
customers (Erlang C for the chance to wait; the deterministic service halves M/M/c's wait).

:func:`fleet_plan` sizes the processes around the replicas (API pods, batchers, result-routers, Redis, brokers) from CPU
ms per request per process kind (:func:`cpu_profile`, from an ``llmq bench scale`` JSON), the topics' partitions that
cap their consumers, and the brokers' bytes/s (:func:`record_bytes`, :func:`kafka_traffic`).

Run: ``llmq capacity --peak-rps 40000 --max-batch 64 --batch-time-ms 250 --p99-target-ms 600 --headroom 0.3``.
"""

from __future__ import annotations

import math

from llmq_bench.batch_time import BatchTimeModel
from llmq_bench.simulate import run_simulation
from llmq_core import constants, ids, wire


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
    batch_time: BatchTimeModel | None = None,
) -> dict:
    """Closed-form capacity plan. ``headroom``: share of capacity kept free for bursts (0.3: run at <= 70%);
    ``spare_replicas``: added on top so losing a host keeps the plan (N+1); ``batch_time``: a batch's time as a
    function of its uncached prompt tokens (None: every batch takes ``batch_time_ms``). Returns a dict of throughputs
    (req/s), replica counts, utilisation, batch times and expected latency parts (ms); ValueError on input that makes
    no plan."""
    if not rps > 0 or max_batch < 1 or spare_replicas < 0:
        raise ValueError(
            f"want a peak > 0 req/s, batches of >= 1 and spare replicas >= 0, not {rps:g}, {max_batch}, "
            f"{spare_replicas}"
        )
    if problem := headroom_problem(headroom):
        raise ValueError(problem)
    model = batch_time or BatchTimeModel(fixed_ms=batch_time_ms)
    full_ms, half_ms = model.expected_batch_ms(max_batch), model.expected_batch_ms(max_batch / 2)
    full = max_batch * 1000 / full_ms
    half = max_batch / 2 * 1000 / half_ms
    minimum = math.ceil(rps / full)
    planned = math.ceil(rps / (full * (1 - headroom))) + spare_replicas
    fill_ms = (max_batch - 1) / (2 * rps / 1000)  # mean wait for the rest of one's batch to arrive
    queue = queueing_delay(rps, planned, max_batch, full_ms)
    return {
        "rps": rps,
        "batch_time_model": model.describe(),
        "batch_time_ms_full_batch": round(full_ms, 3),
        "max_batch_within_target": max_batch_within(model, max_batch, p99_target_ms - network_ms - wait_ms),
        "per_replica_rps_full_batches": full,
        "per_replica_rps_half_batches": half,
        "replicas_at_100pct_full_batches": minimum,
        "replicas_at_100pct_half_batches": math.ceil(rps / half),
        "replicas_planned": planned,
        "utilization_planned": round(rps / (planned * full), 4),
        "batch_fill_wait_ms": round(min(fill_ms, wait_ms), 3),
        "queue_wait_ms": queue,
        "expected_latency_ms": round(network_ms + min(fill_ms, wait_ms) + queue["mean_ms"] + full_ms, 3),
        "p99_latency_bound_ms": round(network_ms + wait_ms + queue["p99_ms"] + full_ms, 3),
        "latency_bound_with_a_free_replica_ms": network_ms + wait_ms + full_ms,  # low load: window + one batch
        "p99_target_ms": p99_target_ms,
    }


def headroom_problem(headroom: float) -> str | None:
    """Why ``headroom`` is no share of capacity to keep free (a sentence), or None."""
    return None if 0 <= headroom < 1 else f"--headroom is the share of capacity kept free, 0 <= h < 1, not {headroom:g}"


def max_batch_within(model: BatchTimeModel, max_batch: int, budget_ms: float) -> int:
    """The largest batch (<= ``max_batch``) whose expected time fits ``budget_ms`` (the latency target less the batch
    window and the network), queueing left out; 0 when even one request does not fit."""
    if model.expected_batch_ms(1) > budget_ms:
        return 0
    if model.fixed:
        return max_batch
    fits = (budget_ms - model.fixed_ms) / (model.prefill_ms_per_token * model.mean_uncached_tokens)
    return min(max_batch, math.floor(fits))


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
    expired, by bisection from the full-batch minimum (of ``sim_options``' ``batch_time`` model, when given).
    Returns {replicas, simulation}."""

    def meets(replicas: int) -> dict | None:
        result = run_simulation(
            rps, replicas, max_batch, batch_time_ms, duration_s, network_ms=network_ms, **sim_options
        )
        ok = result["expired"] == 0 and result["latency_ms"]["p99"] is not None
        return result if ok and result["latency_ms"]["p99"] < p99_target_ms else None

    model = sim_options.get("batch_time") or BatchTimeModel(fixed_ms=batch_time_ms)
    full_ms = model.expected_batch_ms(max_batch)
    low = math.ceil(rps * full_ms / (1000 * max_batch)) - 1  # below full-batch capacity: never meets
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
    batch_time: BatchTimeModel | None = None,
    **sim_options,
) -> dict:
    """:func:`capacity_math` with the simulated result at the planned replica count beside it (``simulate``), and
    optionally the fewest replicas that meet the p99 target in simulation (``search``: several runs). ``batch_time``:
    the batch-time model of both (None: fixed ``batch_time_ms``)."""
    report = {
        "math": capacity_math(
            rps, max_batch, batch_time_ms, headroom, spare_replicas, wait_ms, network_ms, p99_target_ms, batch_time
        )
    }
    sim_options["batch_time"] = batch_time
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


# --- the fleet around the accelerators -----------------------------------------------------------------------------

# Cores one process of a kind can use: an api pod, a batcher and a result-router are one asyncio event loop each, and
# Redis runs its commands on one thread; a Kafka broker's cores are an assumption (8), --broker-cores sets them.
PROCESS_CORES = {"api": 1.0, "batcher": 1.0, "result-router": 1.0, "redis": 1.0, "kafka": 8.0}
PROCESS_KINDS = (*PROCESS_CORES, "worker")
# Consumers of each llmq topic, one partition each at most (a consumer group gives a partition to one member; worker N
# reads partition N of llmq.batches): topic -> (process kind, the setting of its partitions)
CONSUMED_BY = {
    "llmq.requests.<class>": ("batcher", "LLMQ_KAFKA_REQUEST_TOPIC_PARTITIONS"),
    constants.TOPIC_BATCHES: ("worker", "LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS"),
    constants.TOPIC_RESULTS: ("result-router", "LLMQ_KAFKA_RESULTS_TOPIC_PARTITIONS"),
}


def processes_for(rps: float, cpu_ms_per_request: float, cores_per_process: float, headroom: float) -> dict:
    """One process kind at ``rps``: its CPU ms per request, requests/s one core carries, cores busy at peak and the
    processes of ``cores_per_process`` that keep ``headroom`` of them free (at least one)."""
    cores = rps * cpu_ms_per_request / 1000
    return {
        "cpu_ms_per_request": round(cpu_ms_per_request, 4),
        "requests_per_s_per_core": round(1000 / cpu_ms_per_request, 1) if cpu_ms_per_request else None,
        "cores_at_peak": round(cores, 2),
        "cores_per_process": cores_per_process,
        "processes": max(1, math.ceil(cores / (cores_per_process * (1 - headroom)))),
    }


def partition_caps(consumers: dict[str, int], deployed: dict[str, int]) -> list[dict]:
    """Per topic of :data:`CONSUMED_BY`: its consumers in the plan (``consumers``: kind -> count), the partitions
    that needs (one per consumer), the ``deployed`` ones (topic -> partitions) and the consumers that can work with
    them: a consumer past the partitions gets none and idles, so the partitions cap that kind."""
    caps = []
    for topic, (kind, setting) in CONSUMED_BY.items():
        have = deployed[topic]
        caps.append(
            {
                "topic": topic,
                "consumer": kind,
                "setting": setting,
                "partitions_needed": consumers[kind],
                "partitions_deployed": have,
                "consumers_usable": min(consumers[kind], have),
                "capped": consumers[kind] > have,
            }
        )
    return caps


def record_bytes(prompt_bytes: int, completion_bytes: int, max_batch: int) -> dict:
    """Encoded sizes (msgpack, llmq's default; uncompressed: its producers set no compression) of one request's records:
    its GenerationRequest (``prompt_bytes`` of prompt), its share of a full Batch, and its FinalResult
    (``completion_bytes`` of text). Kafka's own record and batch headers are left out."""
    now_ms = 1_800_000_000_000
    request = wire.GenerationRequest(
        request_id=ids.request_id("us-east-1", "cmpl"),
        model="llmq-sim",
        prompt="x" * prompt_bytes,
        sampling=wire.SamplingParams(max_tokens=64),
        created_ms=now_ms,
        deadline_ms=now_ms + 5000,
        reply_to=wire.HttpReply(instance_id="us-east-1-api-7f9c2d"),
        prompt_tokens=prompt_bytes // 4,
    )
    batch = wire.Batch(
        batch_id="us-east-1-batcher-0-3fa9c1-123456",
        worker_id="us-east-1-worker-12",
        model=request.model,
        requests=[request] * max_batch,
        formed_ms=now_ms,
        flush_reason="size",
    )
    result = wire.FinalResult.for_request(
        request,
        "succeeded",
        finished_ms=now_ms + 300,
        choices=[wire.Choice(index=0, text="x" * completion_bytes, finish_reason="length")],
        usage=wire.Usage.of(request.prompt_tokens, completion_bytes // 4),
        timings=wire.Timings(queued_ms=30, ttft_ms=280, total_ms=300),
        worker_id=batch.worker_id,
        batch_size=max_batch,
    )
    return {
        "request": len(wire.encode(request)),
        "batch_per_request": round(len(wire.encode(batch)) / max_batch, 1),
        "result": len(wire.encode(result)),
    }


def kafka_traffic(rps: float, record: dict, replication_factor: int, batchers: int) -> dict:
    """Bytes/s through the brokers at ``rps``: produced to partition leaders (each request's three records), copied to
    followers (``replication_factor`` - 1 copies) and fetched by consumers (requests by batchers, batches by workers,
    results by the result-routers' group and by every batcher, which tails llmq.results without a group)."""
    produced = rps * (record["request"] + record["batch_per_request"] + record["result"])
    fetched = rps * (record["request"] + record["batch_per_request"] + record["result"] * (1 + batchers))
    return {
        "record_bytes": record,
        "produced_bytes_per_s": round(produced),
        "replicated_bytes_per_s": round(produced * (replication_factor - 1)),
        "fetched_bytes_per_s": round(fetched),
    }


def fleet_plan(
    rps: float,
    cpu_ms_per_request: dict[str, float],
    *,
    replicas: int,
    headroom: float = 0.3,
    broker_cores: float = PROCESS_CORES["kafka"],
    replication_factor: int = 3,
    deployed_partitions: dict[str, int] | None = None,
    record: dict | None = None,
) -> dict:
    """The processes around ``replicas`` accelerator workers at a peak of ``rps``, from CPU ms per request of each
    kind (``cpu_ms_per_request``: kind of :data:`PROCESS_KINDS` -> ms, all processes of the kind together), each kind
    with ``headroom`` of its cores free. Brokers: the broker's CPU per request (measured on one broker with one replica)
    times ``replication_factor`` (a follower's copy assumed to cost what the leader's write does), over
    ``broker_cores`` each, and never fewer than ``replication_factor``. ``deployed_partitions`` (topic of
    :data:`CONSUMED_BY` -> partitions; None: as many as the plan needs) caps the consumers that can work; ``record``
    (:func:`record_bytes`) adds the brokers' bytes/s. Returns plain data; ValueError on input that makes no plan."""
    problem = _fleet_problem(rps, cpu_ms_per_request, replicas, headroom, broker_cores, replication_factor)
    if problem:
        raise ValueError(problem)
    cores = PROCESS_CORES | {"kafka": broker_cores}
    ms = dict(cpu_ms_per_request) | {"kafka": cpu_ms_per_request["kafka"] * replication_factor}
    kinds = {kind: processes_for(rps, ms[kind], cores[kind], headroom) for kind in PROCESS_CORES}
    kinds["kafka"]["processes"] = max(replication_factor, kinds["kafka"]["processes"])
    kinds["kafka"]["replication_factor"] = replication_factor
    consumers = {"batcher": kinds["batcher"]["processes"], "worker": replicas}
    consumers["result-router"] = kinds["result-router"]["processes"]
    needed = {topic: consumers[kind] for topic, (kind, _) in CONSUMED_BY.items()}
    plan = {
        "rps": rps,
        "headroom": headroom,
        "processes": kinds,
        "workers": {
            "replicas": replicas,
            "cpu_ms_per_request": cpu_ms_per_request["worker"],
            "cores_per_worker_at_peak": round(rps / replicas * cpu_ms_per_request["worker"] / 1000, 3),
        },
        "partitions": partition_caps(consumers, deployed_partitions or needed),
        "one_redis_enough": kinds["redis"]["processes"] == 1,  # llmq talks to one Redis (LLMQ_REDIS_URL)
    }
    if record is not None:
        plan["kafka_traffic"] = kafka_traffic(rps, record, replication_factor, kinds["batcher"]["processes"])
    return plan


def _fleet_problem(
    rps: float, cpu_ms: dict[str, float], replicas: int, headroom: float, broker_cores: float, replication: int
) -> str | None:
    missing = [kind for kind in PROCESS_KINDS if kind not in cpu_ms]
    if missing:
        return f"the CPU profile has no figure for {', '.join(missing)} (it needs {', '.join(PROCESS_KINDS)})"
    negative = [kind for kind in PROCESS_KINDS if not cpu_ms[kind] >= 0]
    if negative:
        return f"CPU ms per request must be >= 0: {', '.join(f'{k} {cpu_ms[k]}' for k in negative)}"
    if not rps > 0 or replicas < 1:
        return f"want a peak > 0 req/s and at least one replica, not {rps:g} req/s on {replicas}"
    if headroom_problem(headroom):
        return headroom_problem(headroom)
    if not broker_cores > 0 or replication < 1:
        return f"want --broker-cores > 0 and --replication-factor >= 1, not {broker_cores:g} and {replication}"
    return None


DEFAULT_CPU_PROFILE = "bench/results/scale-profile.json"  # `llmq bench scale` below saturation (docs/simulator.md)
SATURATED_BELOW = 0.98  # a run that answered less than this share of its requests ran at saturation or past it


def cpu_profile(data: dict, source: str) -> dict:
    """CPU ms per request per process kind from an ``llmq bench scale`` JSON (``data``, read from ``source``): its
    HTTP-fed run with the fewest batchers, with the load and the batch fill it was measured at, and the batcher's
    figure of a Kafka-fed run of as many batchers (the batcher alone, fed by a Kafka-direct producer) beside it where
    the JSON has one. ValueError when ``data`` is not such a JSON."""
    try:
        http = [run for run in data["runs"] if run.get("feed", "http") == "http"]
        run = min(http, key=lambda r: r["batchers"])
        cpu = dict(run["row"]["cpu_ms_per_request"])
        report = run["report"]
        answered_share = report["succeeded"] / report["requests"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"{source} is not an `llmq bench scale` JSON with an HTTP-fed run ({exc!r})") from exc
    alone = [r for r in data["runs"] if r.get("feed") == "kafka" and r.get("batchers") == run["batchers"]]
    return {
        "source": source,
        "batchers": run["batchers"],
        "offered_rps": round(report["offered_rps"], 1),
        "answered_share": round(answered_share, 4),
        "below_saturation": answered_share >= SATURATED_BELOW,
        "batch_fill": run["row"].get("batch_fill"),
        "machine_busy_fraction": run.get("machine_busy_fraction"),
        "cpu_ms_per_request": cpu,
        "batcher_alone_ms_per_request": alone[0]["row"]["cpu_ms_per_request"]["batcher"] if alone else None,
        "batcher_growth": batcher_growth(http),
    }


def batcher_growth(runs: list[dict]) -> dict | None:
    """How the batchers' CPU per request (all of them together) grows with their count, between the fewest and the
    most batchers of ``runs``: {batchers: [n1, n2], cpu_ms_per_request: [ms1, ms2], ms_per_extra_batcher}; None
    with a single count (each batcher tails every result of llmq.results without a group: a cost that grows)."""
    low, high = min(runs, key=lambda r: r["batchers"]), max(runs, key=lambda r: r["batchers"])
    if low["batchers"] == high["batchers"]:
        return None
    ms = [run["row"]["cpu_ms_per_request"]["batcher"] for run in (low, high)]
    return {
        "batchers": [low["batchers"], high["batchers"]],
        "cpu_ms_per_request": ms,
        "ms_per_extra_batcher": round((ms[1] - ms[0]) / (high["batchers"] - low["batchers"]), 4),
    }

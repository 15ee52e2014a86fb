"""What tracing costs the hot path: requests/s through the services' own I/O edges, in one process.

Per request: the API pod's Kafka producer, the batcher's ``ingest`` and ``step`` (batches of up to 64), the worker's take
and deliver on an engine that finishes at once, and the result-router's record handling; fakes stand in for Kafka and
Redis, so the numbers are the Python cost of llmq's own code. Configurations, each in a fresh process, interleaved and
repeated (the best run of each counts; medians too), each timed in CPU seconds of its process:

- ``baseline``: the same build without tracing code: ``git archive`` of ``--ref`` with every ``tracing.enabled()``
  check in the services replaced by ``False`` (Python compiles the traced branches away), no metrics objects;
- ``off``: ``--ref`` as it is, tracing not configured (the default, ``LLMQ_TRACING_EXPORTER=none``), no metrics objects;
- ``off+metrics``: as off, with the Prometheus metrics the services record;
- ``on``: this build, tracing on with an exporter that drops the spans (the SDK's full cost, no I/O; 1/5 the requests).

Both builds come from the same commit (default HEAD; not the working tree), so they differ only in the tracing checks.
The requirement is ``off`` >= 0.98 x ``baseline``. A shared machine is noisy, so the run also bounds the off switch's
cost directly: it counts the ``tracing.enabled()`` checks per request and times one check.

    .venv/bin/python bench/bench_tracing_overhead.py [--requests 5000] [--repeats 9] [--ref REF]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACING_CHECK = "tracing.enabled()"
SERVICE_DIRS = ("libs", "services/api", "services/batcher", "services/worker", "services/result-router")
ROUND = 64  # requests per batcher step (the worker's slots)


# --- the workload (runs in the child process, against whichever build is on the path) ---------------------------------


class Bus:
    """aiokafka producer and consumer stand-in: keeps the records of each topic, acks at once."""

    def __init__(self) -> None:
        self.records: dict[str, list] = {}

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        self.records.setdefault(topic, []).append((value, tuple(headers or ())))

    async def send(self, topic, value, key=None, partition=None, headers=None):
        await self.send_and_wait(topic, value, key, partition, headers)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def commit(self, offsets) -> None:
        pass

    def assignment(self):
        return set()

    def paused(self):
        return set()

    def drain(self, topic: str) -> list:
        return self.records.pop(topic, [])


class Redis:
    """The Redis calls of the batcher, the worker and the result-router, doing nothing."""

    async def publish(self, channel, data):
        return 0

    async def set(self, *args, **kwargs):
        return True

    async def exists(self, key):
        return 0

    def pipeline(self, transaction=False):
        return _Pipeline()

    def register_script(self, source):  # the result-router's store: [stored (1), nothing dropped]
        async def stored(keys=(), args=()):
            return [1, 0]

        return stored


class _Pipeline:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def __getattr__(self, name):  # hincrby, hset, publish, set
        return lambda *args, **kwargs: None

    async def execute(self):
        return []


class Record:
    __slots__ = ("offset", "value", "headers", "key", "topic", "partition")

    def __init__(self, offset, value, headers, topic) -> None:
        self.offset, self.value, self.headers, self.key, self.topic, self.partition = (
            offset,
            value,
            headers,
            None,
            topic,
            0,
        )


class InstantEngine:
    """Finishes every submitted request at once with four tokens."""

    fixed_batch_time_ms = 0
    context_window = 8192

    def __init__(self, slots: int) -> None:
        from llmq_core import wire
        from llmq_core.clock import SYSTEM_CLOCK
        from llmq_worker.engine import Capacity, FinalEvent

        self._wire, self._clock, self._capacity, self._final = wire, SYSTEM_CLOCK, Capacity, FinalEvent
        self.slots = slots
        self.done: list = []

    def submit(self, request) -> None:
        wire, now = self._wire, self._clock.now_ms()
        self.done.append(
            self._final(
                request_id=request.request_id,
                outcome=wire.Outcome.SUCCEEDED,
                choices=[wire.Choice(index=0, text="abca", finish_reason="length")],
                usage=wire.Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
                started_ms=now,
                first_token_ms=now,
                finished_ms=now,
            )
        )

    def cancel(self, request_id) -> None:
        pass

    def capacity(self):
        return self._capacity(max_slots=self.slots, running=0, queued=0, est_drain_ms=0)

    def events(self) -> list:
        out, self.done = self.done, []
        return out


def _kwargs(cls, **wanted) -> dict:
    """The keyword arguments ``cls`` takes (the baseline build has no ``metrics``)."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in wanted.items() if k in params}


async def run_pipeline(requests: int, mode: str) -> float:
    """Push ``requests`` through api -> batcher -> worker -> router; returns requests per CPU second of this process
    (CPU time, not wall time: on a shared machine other processes' load would swamp a 2% difference)."""
    from llmq_api.pod import KafkaRequestProducer
    from llmq_batcher.loop import BatcherLoop
    from llmq_batcher.policy import BatchPolicy, PolicyConfig
    from llmq_core import constants, wire
    from llmq_core.clock import SYSTEM_CLOCK
    from llmq_core.settings import Settings
    from llmq_result_router.loop import ResultRouter
    from llmq_worker.loop import WorkerLoop

    metrics = {}
    if mode in ("on", "off+metrics"):
        from llmq_core import metrics as m

        metrics = {"batcher": m.BatcherMetrics(), "worker": m.WorkerMetrics("llmq-sim"), "router": m.RouterMetrics()}
    if mode == "on":
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        from llmq_core import tracing

        class Drop(SpanExporter):
            def export(self, spans):
                return SpanExportResult.SUCCESS

        tracing.configure("bench", Settings(), exporter=Drop())

    bus, redis = Bus(), Redis()
    api = KafkaRequestProducer(Settings())
    api._producer, api.ready = bus, True
    policy = BatchPolicy(PolicyConfig.defaults("b"))
    batcher = BatcherLoop(
        policy, bus, bus, redis, SYSTEM_CLOCK, max_queued=10**7, **_kwargs(BatcherLoop, metrics=metrics.get("batcher"))
    )
    engine = InstantEngine(ROUND)
    worker = WorkerLoop.build(
        engine,
        bus,
        bus,
        redis,
        Settings(worker={"heartbeat_interval_ms": 250}, runtime={"shutdown_grace_s": 1}),
        worker_id="w0",
        partition=0,
        model="llmq-sim",
        max_pending=10**6,
        **_kwargs(WorkerLoop.build, metrics=metrics.get("worker")),
    )
    core = worker.core
    router = ResultRouter(Settings(), bus, bus, redis, **_kwargs(ResultRouter, metrics=metrics.get("router")))
    topic = constants.requests_topic("interactive")
    tp = _TopicPartition(topic)
    offset = 0

    async def one_round(n: int) -> None:
        nonlocal offset
        now = SYSTEM_CLOCK.now_ms()
        policy.on_heartbeat(core.heartbeat(now, engine.context_window), now)
        for i in range(n):
            await api.produce(
                wire.GenerationRequest(
                    request_id=f"r{offset + i}",
                    tenant_id="t",
                    model="llmq-sim",
                    prompt="abc",
                    created_ms=now,
                    deadline_ms=now + 60_000,
                    reply_to=wire.HttpReply(instance_id="pod"),
                    prompt_tokens=3,
                    sampling=wire.SamplingParams(max_tokens=4),
                )
            )
        for value, headers in bus.drain(topic):
            await batcher.ingest(tp, Record(offset, value, headers, topic))
            offset += 1
        await batcher.step()
        for value, headers in bus.drain(constants.TOPIC_BATCHES):
            taken = worker._take(Record(offset, value, headers, constants.TOPIC_BATCHES))
            await worker._deliver(await taken if inspect.isawaitable(taken) else taken)
        await worker._deliver(core.on_events(engine.events()))
        for value, headers in bus.drain(constants.TOPIC_RESULTS):
            await router._handle(Record(0, value, headers, constants.TOPIC_RESULTS))

    for _ in range(1000 // ROUND):  # warm up
        await one_round(ROUND)
    started = time.process_time()
    for done in range(0, requests, ROUND):
        await one_round(min(ROUND, requests - done))
    return requests / (time.process_time() - started)


def _TopicPartition(topic: str):
    from aiokafka import TopicPartition

    return TopicPartition(topic, 0)


# --- the driver --------------------------------------------------------------------------------------------------------


def build_tree(ref: str, into: Path, without_tracing: bool) -> dict[str, str]:
    """Extract ``ref``'s libs and services into ``into`` (``without_tracing``: every service's tracing check becomes
    ``False``); returns the environment that puts them first on the path. Raises if no check was found."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *SERVICE_DIRS], check=True, capture_output=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    if without_tracing:
        replaced = 0
        for path in into.glob("services/*/llmq_*/**/*.py"):
            text = path.read_text()
            replaced += text.count(TRACING_CHECK)
            path.write_text(text.replace(TRACING_CHECK, "False"))
        if not replaced:
            raise RuntimeError(f"no {TRACING_CHECK} in the services of {ref}")
    return {"PYTHONPATH": os.pathsep.join(str(into / d) for d in SERVICE_DIRS)}


def count_hooks(requests: int) -> dict:
    """Tracing-off checks per request (``tracing.enabled()`` calls, counted) and the time of one check (ns)."""
    import timeit

    from llmq_core import tracing

    calls = 0
    enabled = tracing.enabled

    def counting() -> bool:
        nonlocal calls
        calls += 1
        return enabled()

    tracing.enabled = counting
    asyncio.run(run_pipeline(requests, "off"))
    tracing.enabled = enabled
    warmup = 1000 // ROUND * ROUND
    check_ns = min(timeit.repeat(enabled, number=100_000, repeat=5, timer=time.process_time)) / 100_000 * 1e9
    return {"checks_per_request": calls / (requests + warmup), "ns_per_check": check_ns}


def run_child(mode: str, requests: int, env_extra: dict[str, str]) -> dict:
    env = {**os.environ, "LLMQ_TRACING_EXPORTER": "none", **env_extra}
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--requests", str(requests)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ref", default="HEAD", help="the commit to measure (both builds come from it)")
    parser.add_argument("--child", choices=["baseline", "off", "off+metrics", "on", "hooks"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "hooks":
        print(json.dumps(count_hooks(args.requests)))
        return
    if args.child:
        rate = asyncio.run(run_pipeline(args.requests, args.child))
        import llmq_core

        print(json.dumps({"mode": args.child, "requests_per_s": rate, "llmq_core": llmq_core.__file__}))
        return
    modes = ("baseline", "off", "off+metrics", "on")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            "baseline": build_tree(args.ref, Path(tmp) / "without", True),
            "measured": build_tree(args.ref, Path(tmp) / "with", False),
        }
        for _ in range(args.repeats):
            for mode in modes:
                requests = args.requests // 5 if mode == "on" else args.requests
                env = builds["baseline" if mode == "baseline" else "measured"]
                rates[mode].append(run_child(mode, requests, env)["requests_per_s"])
        hooks = run_child("hooks", 2000, builds["measured"])
    best = {mode: max(values) for mode, values in rates.items()}
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    off_share = hooks["checks_per_request"] * hooks["ns_per_check"] * best["off"] / 1e9
    result = {
        "requests": args.requests,
        "repeats": args.repeats,
        "ref": args.ref,
        "best_requests_per_s": {m: round(v) for m, v in best.items()},
        "all_requests_per_s": {m: [round(v) for v in vs] for m, vs in rates.items()},
        "median_requests_per_s": {m: round(v) for m, v in median.items()},
        "ratio_off_vs_baseline": round(best["off"] / best["baseline"], 4),
        "median_ratio_off_vs_baseline": round(median["off"] / median["baseline"], 4),
        "ratio_off_metrics_vs_baseline": round(best["off+metrics"] / best["baseline"], 4),
        "ratio_on_vs_baseline": round(best["on"] / best["baseline"], 4),
        "off_checks_per_request": round(hooks["checks_per_request"], 2),
        "ns_per_off_check": round(hooks["ns_per_check"], 1),
        "off_checks_share_of_request_time": round(off_share, 6),
        "ratio_off_vs_no_tracing_code_bound": round(1 - off_share, 6),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

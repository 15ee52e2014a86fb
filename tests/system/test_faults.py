"""Faults survived: kill, stop, restart and overload real processes under load; nothing lost, nothing answered twice.

One private stack for the module (its own Kafka and Redis, so they too can be stopped): two API pods, the batcher, two
llmq-sim workers (fixed 500 ms batches of at most 4: 16 requests/s in all), the result-router. Each test runs a load
generator through its fault that counts, for every request it sent, how it ended (see tests/system/faults/loadgen.py), and
writes its numbers to var/faults/report.json (docs/faults.md's table).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from llmq_bench.loadgen import wait_ready
from llmq_cli.devstack import DevStack, StackConfig
from llmq_core import constants, ids, kafka, wire
from tests import ports
from tests.system.faults.loadgen import KAFKA_TENANT, Ending, HttpLoad, KafkaLoad, Tally
from tests.system.faults.report import FaultReport
from tests.system.faults.stack import FaultStack, Tap

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]  # latency bounds: the machine to itself

ROOT = Path(__file__).resolve().parents[2]
BASE = ports.block()
STATE = ROOT / "var" / "faults"
BATCH_MS = 500
MAX_BATCH = 4
CAPACITY_PER_S = 2 * MAX_BATCH * 1000 / BATCH_MS  # two workers
WORKER_HEARTBEAT_TIMEOUT_MS = 2000
POD_HEARTBEAT_TTL_MS = 2000
SHUTDOWN_GRACE_S = 8
POISON = "POISON-PILL"
KEYS = "keys:\n  - {tenant: alpha, key: k-alpha}\n  - {tenant: beta, key: k-beta}\n"
NEVER = (Ending.LOST, Ending.TWICE, Ending.WRONG, Ending.DROPPED)

REPORT = FaultReport(STATE / "report.json")


def config() -> StackConfig:
    env = {
        "LLMQ_API_KEYS_FILE": str(STATE / "keys.yaml"),
        "LLMQ_API_POD_HEARTBEAT_INTERVAL_MS": "500",
        "LLMQ_API_POD_HEARTBEAT_TTL_MS": str(POD_HEARTBEAT_TTL_MS),
        "LLMQ_BATCHER_WORKER_HEARTBEAT_TIMEOUT_MS": str(WORKER_HEARTBEAT_TIMEOUT_MS),
        "LLMQ_SHUTDOWN_GRACE_S": str(SHUTDOWN_GRACE_S),
        # A draining pod's listener stays open this long, so that the load generator (a Service: it follows readiness)
        # sends no connection to be reset at its close.
        "LLMQ_API_SHUTDOWN_DELAY_MS": "1500",
        # The faults need work queued when they strike (the API pod kill: ~6 s of a dead pod's near_interactive
        # burst): admission predicts waits from the queue ahead, so it must not shed these classes here.
        "LLMQ_API_SHED_WAIT_MS": json.dumps(
            {"interactive:paid": 15_000, "interactive:free": 5_000, "near_interactive": 60_000, "deferred": 60_000}
        ),
    }
    # An allocated block below the kernel's ephemeral range (tests/ports.py): a restarted process gets its port
    # back. Metrics: API port + 10... (DevStack).
    return StackConfig(
        state_dir=STATE,
        kafka_port=BASE + 30,
        redis_port=BASE + 35,
        api_ports=(BASE, BASE + 1),
        tiny_workers=0,
        sim_workers=2,
        sim_batch_time_ms=BATCH_MS,
        sim_max_batch_size=MAX_BATCH,
        sim_worker_args=("--poison-marker", POISON),
        extra_env=env,
    )


@pytest.fixture(scope="module")
def faults():
    cfg = config()
    DevStack(cfg).down()  # leftovers of an interrupted run: only processes started from this state dir
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    (STATE / "keys.yaml").write_text(KEYS)
    stack = FaultStack(cfg)
    try:
        stack.dev.up(timeout_s=240, log=lambda *_: None)
        yield stack
    finally:
        stack.down()


@pytest.fixture
async def stack(faults):
    """The module's stack with every process running and healthy (what an earlier test hurt is started again)."""
    await faults.heal()
    return faults


def no_bad_endings(tally: Tally) -> None:
    bad = [r for r in tally.records if r.ending in NEVER]
    assert not bad, f"{tally.summary()}; first: {bad[:3]}"


def all_answered(tally: Tally) -> None:
    bad = tally.failures()
    assert not bad, f"{tally.summary()}; first: {bad[:3]}"


# --- 1. a worker dies mid-batch -----------------------------------------------------------------------------------------


async def test_worker_kill9_mid_batch_moves_its_work_to_the_other_worker(stack):
    batches = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_BATCHES)
    results = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_RESULTS)
    await batches.start()
    await results.start()
    load = HttpLoad(stack.api_ports, rate_per_s=5, timeout_ms=20_000, tag="worker-kill")
    # streams stranded mid-text continue on the other worker from their tokens: each is checked for its whole text
    streams = HttpLoad(stack.api_ports, rate_per_s=3, timeout_ms=20_000, stream=True, tag="worker-kill-streams")
    load.start()
    streams.start()
    await asyncio.sleep(3)
    async with asyncio.timeout(10):
        while not ((hb := await stack.worker_heartbeat("sim-0")) and hb.running):
            await asyncio.sleep(0.02)
    killed_s = stack.send("worker-sim-0", signal.SIGKILL)
    killed_ms = int(time.time() * 1000)
    await asyncio.sleep(8)
    tally, streamed = await asyncio.gather(load.stop(), streams.stop())
    await asyncio.sleep(1)
    await batches.stop()
    await results.stop()

    finals: dict[str, list[wire.FinalResult]] = {}
    for result in results.messages(wire.FinalResult):
        finals.setdefault(result.request_id, []).append(result)
    dead = stack.cfg.instance_id("sim-0")
    on_dead = {r.request_id for b in batches.messages(wire.Batch) if b.worker_id == dead for r in b.requests}
    stranded = [
        rid
        for rid in on_dead
        if not any(f.worker_id == dead and f.finished_ms <= killed_ms for f in finals.get(rid, []))
    ]
    assert stranded, "the kill found no request in flight on the worker"
    moved_ms = []
    for rid in stranded:
        done = [
            f
            for f in finals.get(rid, [])
            if f.outcome is wire.Outcome.SUCCEEDED and f.worker_id == stack.cfg.instance_id("sim-1")
        ]
        assert done, f"{rid} was in flight on the killed worker and never finished elsewhere"
        moved_ms.append(min(f.finished_ms for f in done) - killed_ms)
    # + the batch the other worker may be running (a fixed-time engine takes no work mid-batch), + the batches the
    # stranded requests fill there (the dead worker held a running batch and maybe a queued one), + CPU slack
    bound_ms = WORKER_HEARTBEAT_TIMEOUT_MS + (1 + math.ceil(len(stranded) / MAX_BATCH)) * BATCH_MS + 500
    REPORT.record_split(
        "worker kill -9 mid-batch",
        tally,
        killed_s - 1,
        killed_s + 4,
        note=f"{len(stranded)} stranded requests finished on the other worker {max(moved_ms)} ms after the kill",
    )
    all_answered(tally)
    all_answered(streamed)  # no stream_interrupted: one generation each, nothing repeated or missing
    assert max(moved_ms) <= bound_ms, f"stranded work finished {sorted(moved_ms)} ms after the kill"


# --- 2. the batcher dies and comes back ---------------------------------------------------------------------------------


async def test_batcher_kill9_and_restart_consumes_what_it_held_again(stack):
    load = HttpLoad(stack.api_ports, rate_per_s=8, timeout_ms=60_000, tag="batcher-kill")
    load.start()
    await asyncio.sleep(3)
    killed_s, healed_s = await stack.kill_and_heal("batcher", down_s=2)
    await asyncio.sleep(6)
    tally = await load.stop()
    during = tally.where(since_s=killed_s - 1, until_s=healed_s)
    REPORT.record(
        "batcher kill -9, restart",
        during,
        tally.where(since_s=healed_s + 2),
        total=tally,
        note=f"restarted {healed_s - killed_s:.1f} s after the kill",
    )
    all_answered(tally)
    assert len(during) > 10


# --- 3. the result-router dies and comes back ---------------------------------------------------------------------------


async def test_result_router_kill9_and_restart_delivers_every_reply_and_stored_result(stack):
    kafka_load, http_load = await mixed_load(
        stack, kafka_rate_per_s=4, http_rate_per_s=4, timeout_ms=20_000, tag="router-kill"
    )
    await asyncio.sleep(3)
    killed_s, healed_s = await stack.kill_and_heal("result-router", down_s=3)
    await asyncio.sleep(4)
    http = await http_load.stop()
    replies = await kafka_load.stop(settle_s=30)

    kafka_ids = [ids.tenant_scoped_id(KAFKA_TENANT, request_id) for request_id in kafka_load.sent]
    stored_ids = [r.request_id for r in http.records if r.ending is Ending.ONCE] + kafka_ids
    missing = await unstored(stack, stored_ids, wait_s=15)
    both = Tally([*http.records, *replies.records])
    REPORT.record_split(
        "result-router kill -9, restart",
        both,
        killed_s,
        healed_s,
        note=f"{len(replies)} Kafka replies and {len(stored_ids)} stored results checked",
    )
    all_answered(replies)
    all_answered(http)
    assert not missing, f"{len(missing)} results never stored, e.g. {missing[:3]}"


async def mixed_load(
    stack: FaultStack, *, kafka_rate_per_s: float, http_rate_per_s: float, timeout_ms: int, tag: str
) -> tuple[KafkaLoad, HttpLoad]:
    """Load over Kafka (its replies on a topic of their own) and over HTTP (``timeout_ms``, ``tag``), both started."""
    reply_topic = f"faults.replies.{uuid.uuid4().hex[:8]}"
    await kafka.create_topic(stack.cfg.settings(), reply_topic)
    kafka_load = KafkaLoad(stack.cfg.kafka_bootstrap, reply_topic, rate_per_s=kafka_rate_per_s)
    http_load = HttpLoad(stack.api_ports, rate_per_s=http_rate_per_s, timeout_ms=timeout_ms, tag=tag)
    await kafka_load.start()
    http_load.start()
    return kafka_load, http_load


async def unstored(stack: FaultStack, request_ids: list[str], wait_s: float) -> list[str]:
    """The request ids without a stored result after up to ``wait_s`` (the router may still be catching up)."""
    redis = stack.redis()
    deadline_s = time.monotonic() + wait_s
    try:
        while True:
            stored = await redis.mget([constants.result_key(rid) for rid in request_ids])
            missing = [rid for rid, data in zip(request_ids, stored) if data is None]
            if not missing or time.monotonic() > deadline_s:
                return missing
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()


# --- 4. Redis restarts under streams ------------------------------------------------------------------------------------


async def test_redis_restart_during_streams_ends_every_stream_and_pods_resubscribe(stack):
    pids = stack.pids()
    streams = HttpLoad(
        stack.api_ports, rate_per_s=1, timeout_ms=10_000, stream=True, max_tokens=32, tag="redis-streams"
    )
    in_flight = streams.burst(20)  # three rounds of batches: still streaming when Redis goes
    await asyncio.sleep(0.3)
    killed_s = stack.send("redis", signal.SIGKILL)
    await stack.wait_exit("redis", 5)
    await stack.heal()  # Redis starts again, empty; the services must find it on their own
    await asyncio.gather(*in_flight)
    during = await streams.stop()
    # every API pod answers /dependencies with 200 (Kafka and Redis up; /readyz stays 200 while degraded)
    await wait_ready([f"http://127.0.0.1:{port}" for port in stack.api_ports], 20, path="/dependencies")
    healed_s = time.monotonic()
    after_load = HttpLoad(stack.api_ports, rate_per_s=1, timeout_ms=10_000, stream=True, tag="after-redis")
    plain = HttpLoad(stack.api_ports, rate_per_s=1, timeout_ms=10_000, tag="after-redis")
    await asyncio.gather(*after_load.burst(10), *plain.burst(10))
    after = Tally([*(await after_load.stop()).records, *(await plain.stop()).records])
    REPORT.record(
        "Redis restart under 20 streams",
        during,
        after,
        note=f"in-flight streams: {during.counts()}; ready again {healed_s - killed_s:.1f} s after the kill",
    )
    no_bad_endings(during)
    hung = [r for r in during.records if r.latency_ms > streams.timeout_ms + 1000]
    assert not hung, f"streams that outlived their deadline: {hung[:3]}"
    all_answered(after)
    assert stack.pids() == pids and all(stack.alive(name) for name in pids), "an llmq process died or restarted"


# --- 5. the Kafka broker stops and starts again -------------------------------------------------------------------------


async def test_kafka_outage_fails_fast_with_503_and_recovers_without_restarts(stack):
    pids = stack.pids()
    load = HttpLoad(stack.api_ports, rate_per_s=4, timeout_ms=15_000, tag="kafka-outage")
    load.start()
    await asyncio.sleep(3)
    stack.send("kafka", signal.SIGTERM)
    await stack.wait_exit("kafka", 60)
    down_s = time.monotonic()
    await asyncio.sleep(6)
    restart_s = time.monotonic()
    await stack.heal()  # the broker starts again (its port open, topics there): nothing else is restarted
    up_s = time.monotonic()
    recovered_s = await first_success_after(load, up_s, timeout_s=60)
    await asyncio.sleep(8)
    tally = await load.stop()
    outage = tally.where(since_s=down_s + 1, until_s=restart_s)  # the broker is surely gone for these
    after = tally.where(since_s=recovered_s)
    REPORT.record(
        "Kafka broker stop, start",
        outage,
        after,
        total=tally,
        note=f"{len(outage.where(status=503))} of {len(outage)} requests in the outage got 503; "
        f"broker back in {up_s - restart_s:.0f} s, requests served {recovered_s - up_s:.1f} s later",
    )
    no_bad_endings(tally)
    slow = [r for r in outage.records if r.status != 503 or not r.retry_after or r.latency_ms > 3000]
    assert len(outage) >= 10 and not slow, f"not a fast 503 with Retry-After: {slow[:3]}"
    all_answered(after)
    assert stack.pids() == pids and all(stack.alive(name) for name in pids), "an llmq process died or restarted"


async def first_success_after(load: HttpLoad, since_s: float, timeout_s: float) -> float:
    """When every pod of ``load`` had answered a request sent after ``since_s`` once: the time service came back on
    all of them (each pod's Kafka breaker closes on its own check, up to one check interval apart)."""
    async with asyncio.timeout(timeout_s):
        while True:
            firsts: dict[int, float] = {}
            for r in load.records:
                if r.sent_s >= since_s and r.ending is Ending.ONCE:
                    firsts[r.pod] = min(firsts.get(r.pod, r.sent_s), r.sent_s)
            if len(firsts) == len(load.ports):
                return max(firsts.values())
            await asyncio.sleep(0.2)


# --- 6. overload -------------------------------------------------------------------------------------------------------

# Shed paid requests once their predicted queue wait passes 100 ms, free ones as soon as anything waits.
OVERLOAD_SHED_WAIT_MS = {"interactive:paid": 100, "interactive:free": 0, "near_interactive": 0, "deferred": 0}
OVERLOAD_S = 30


async def test_overload_at_3x_capacity_sheds_with_429_and_keeps_memory_and_paid_latency_bounded(stack):
    await restart_pods(stack, {"LLMQ_API_SHED_WAIT_MS": json.dumps(OVERLOAD_SHED_WAIT_MS)})
    try:
        # 3x capacity in all: paid alone would fit (0.75x), the free excess on top of it must be shed
        paid = HttpLoad(stack.api_ports, rate_per_s=CAPACITY_PER_S * 0.75, timeout_ms=10_000, tag="overload-paid")
        free = HttpLoad(
            stack.api_ports,
            rate_per_s=CAPACITY_PER_S * 2.25,
            timeout_ms=10_000,
            key="llmq-dev-free-key",
            tag="overload-free",
        )
        paid.start()
        free.start()
        await asyncio.sleep(10)  # warm-up: every process has seen the overload
        warm_kb = {name: stack.rss_kb(name) for name in stack.names()}
        started_s = time.monotonic()
        await asyncio.sleep(OVERLOAD_S)
        paid_tally, free_tally = await paid.stop(), await free.stop()
        end_kb = {name: stack.rss_kb(name) for name in stack.names()}
    finally:
        await restart_pods(stack, {})
    during_paid = paid_tally.where(since_s=started_s)
    both = Tally([*paid_tally.records, *free_tally.records])
    growth = {name: round(end_kb[name] / warm_kb[name], 2) for name in warm_kb}
    REPORT.record(
        "overload 3x capacity, 30 s",
        during_paid,
        Tally([]),
        total=both,
        note=f"p99 of admitted paid; shed paid {shed_share(paid_tally):.0%}, free {shed_share(free_tally):.0%}; "
        f"RSS end/warm {growth}",
    )
    no_bad_endings(both)
    refused = [r for r in both.records if r.ending is Ending.ERROR and (r.status != 429 or not r.retry_after)]
    assert not refused, f"errors other than 429 + Retry-After: {refused[:3]}"
    assert paid_tally.count(Ending.TIMEOUT) == 0, paid_tally.summary()
    assert during_paid.p99_ms() < 3 * BATCH_MS, during_paid.summary()
    assert shed_share(free_tally) > shed_share(paid_tally), (paid_tally.summary(), free_tally.summary())
    assert max(growth.values()) <= 1.2, f"RSS after the overload / after warm-up: {growth}"


def shed_share(tally: Tally) -> float:
    return len(tally.where(status=429)) / max(1, len(tally))


async def restart_pods(stack: FaultStack, env: dict[str, str]) -> None:
    """Stop the API pods (SIGTERM), then start them with the module's environment plus ``env``."""
    for name in stack.names("api"):
        stack.send(name, signal.SIGTERM)
    for name in stack.names("api"):
        await stack.wait_exit(name, SHUTDOWN_GRACE_S + 5)
    stack.cfg.extra_env = {**config().extra_env, **env}
    await stack.heal()


# --- 7. poison ----------------------------------------------------------------------------------------------------------


async def test_a_poisoned_request_fails_alone(stack):
    batches = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_BATCHES)
    await batches.start()
    load = HttpLoad(stack.api_ports, rate_per_s=1, timeout_ms=20_000, tag="poison")
    poisoned = HttpLoad(stack.api_ports, rate_per_s=1, timeout_ms=20_000, tag="poison", prompt_suffix=f" {POISON}")
    tasks = load.burst(15) + poisoned.burst(1) + load.burst(15)
    await asyncio.gather(*tasks)
    healthy, bad = await load.stop(), await poisoned.stop()
    await batches.stop()
    [shared] = [b for b in batches.messages(wire.Batch) if any(POISON in (r.prompt or "") for r in b.requests)]
    assert len(shared.requests) > 1, "the poisoned request had a batch of its own: nothing to isolate it from"
    REPORT.record(
        "poisoned request",
        Tally([*healthy.records, *bad.records]),
        Tally([]),
        note=f"the poisoned request's batch held {len(shared.requests)}; only it failed (500 engine_error)",
    )
    assert healthy.count(Ending.ONCE) == len(healthy) == 30, healthy.summary()
    [record] = bad.records
    assert record.ending is Ending.ERROR and record.status == 500 and "engine" in record.detail, record


@pytest.mark.parametrize(
    "topic", [constants.requests_topic(constants.INTERACTIVE), constants.TOPIC_RESULTS, constants.TOPIC_BATCHES]
)
async def test_an_undecodable_record_is_dead_lettered_and_its_consumer_goes_on(stack, topic):
    dead = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_DEAD_LETTERS)
    await dead.start()
    garbage = b"\xc1 not msgpack " + uuid.uuid4().hex.encode()
    partitions = range(2 if topic == constants.TOPIC_BATCHES else 1)  # batches: each worker's partition
    producer = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka_bootstrap)
    await producer.start()
    try:
        for partition in partitions:
            await producer.send_and_wait(
                topic,
                garbage,
                partition=partition,
                headers=[(constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_MSGPACK.encode())],
            )
    finally:
        await producer.stop()
    load = HttpLoad(stack.api_ports, rate_per_s=1, timeout_ms=20_000, tag="after-garbage")
    await asyncio.gather(*load.burst(16))
    after = await load.stop()
    async with asyncio.timeout(10):
        while sum(raw == garbage for _, raw, _ in dead.records) < len(partitions):
            await asyncio.sleep(0.1)
    await dead.stop()
    all_answered(after)
    assert not await unstored(stack, [r.request_id for r in after.records], wait_s=10)  # the router went on too
    assert all(stack.alive(name) for name in stack.names())


# --- 8. an API pod dies -------------------------------------------------------------------------------------------------


async def test_api_pod_kill9_cancels_the_work_it_left_and_spares_the_other_pods_traffic(stack):
    requests = Tap(stack.cfg.kafka_bootstrap, constants.requests_topic(constants.NEAR_INTERACTIVE))
    results = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_RESULTS)
    await requests.start()
    await results.start()
    other = HttpLoad(stack.api_ports[1:], rate_per_s=4, timeout_ms=20_000, key="k-beta", tag="other-pod")
    doomed = HttpLoad(
        stack.api_ports[:1],
        rate_per_s=1,
        timeout_ms=30_000,
        key="k-alpha",
        tag="doomed-pod",
        traffic_class=constants.NEAR_INTERACTIVE,
    )
    other.start()
    await asyncio.sleep(2)
    left = doomed.burst(150)
    async with asyncio.timeout(30):  # ~6 s of work in Kafka: much of it is still queued when the pod dies
        while len(pod_requests(requests, stack.cfg.instance_id("api-0"))) < 100:
            await asyncio.sleep(0.05)
    killed_s = stack.send("api-0", signal.SIGKILL)
    killed_ms = int(time.time() * 1000)
    await asyncio.wait(left, timeout=5)
    await asyncio.sleep(8)
    tally = await other.stop()
    await doomed.stop()
    await requests.stop()
    await results.stop()

    orphans = pod_requests(requests, stack.cfg.instance_id("api-0"))
    finals: dict[str, list[wire.FinalResult]] = {}
    for result in results.messages(wire.FinalResult):
        if result.request_id in orphans:
            finals.setdefault(result.request_id, []).append(result)
    gone_by_ms = killed_ms + POD_HEARTBEAT_TTL_MS + 3 * 500 + 1000  # expiry, grace and checks (500 ms), + slack
    late = [
        f for fs in finals.values() for f in fs if f.outcome is wire.Outcome.SUCCEEDED and f.finished_ms > gone_by_ms
    ]
    canceled = [rid for rid, fs in finals.items() if any(f.outcome is wire.Outcome.CANCELED for f in fs)]
    unfinished = orphans - set(finals)
    REPORT.record_split(
        "API pod kill -9",
        tally,
        killed_s,
        killed_s + 5,
        note=f"other pod's traffic; {len(canceled)} of the dead pod's {len(orphans)} requests cancelled",
    )
    all_answered(tally)
    assert not late, f"{len(late)} requests of the dead pod were computed after it was known gone"
    assert not unfinished, f"{len(unfinished)} requests of the dead pod never ended"
    assert len(canceled) >= 20, f"only {len(canceled)} of the dead pod's {len(orphans)} requests were cancelled"


def pod_requests(requests: Tap, instance_id: str) -> set[str]:
    """Ids of the requests seen on the tap whose replies go to API pod ``instance_id``."""
    return {
        r.request_id
        for r in requests.messages(wire.GenerationRequest)
        if isinstance(r.reply_to, wire.HttpReply) and r.reply_to.instance_id == instance_id
    }


# --- 9. graceful stop and a rolling restart -----------------------------------------------------------------------------

ROLLING_ORDER = ("worker-sim-0", "worker-sim-1", "batcher", "result-router", "api-0", "api-1")


async def test_sigterm_drains_each_service_within_its_bound_and_a_rolling_restart_loses_nothing(stack):
    kafka_load, http_load = await mixed_load(
        stack, kafka_rate_per_s=2, http_rate_per_s=6, timeout_ms=30_000, tag="rolling"
    )
    await asyncio.sleep(3)
    started_s = time.monotonic()
    exits_s, restarts_s = {}, {}
    for name in ROLLING_ORDER:  # one at a time, the next once the stack is whole again
        sent_s = stack.send(name, signal.SIGTERM)
        exits_s[name] = round(await stack.wait_exit(name, SHUTDOWN_GRACE_S + 10), 1)
        await stack.heal()
        restarts_s[name] = round(time.monotonic() - sent_s, 1)
    rolled_s = time.monotonic()
    await asyncio.sleep(4)
    http = await http_load.stop()
    replies = await kafka_load.stop(settle_s=30)
    both = Tally([*http.records, *replies.records])
    REPORT.record_split(
        "SIGTERM rolling restart of every service",
        both,
        started_s,
        rolled_s,
        note=f"seconds to exit after SIGTERM: {exits_s}; to healthy again: {restarts_s}; "
        f"{http_load.rerouted} connections refused by a stopped pod went to the other one",
    )
    no_bad_endings(both)
    assert all(s <= SHUTDOWN_GRACE_S + 1 for s in exits_s.values()), exits_s
    all_answered(replies)
    refused = [r for r in http.records if r.ending is not Ending.ONCE and (r.status != 503 or not r.retry_after)]
    assert not refused, f"not answered and not a 503 + Retry-After from a draining pod: {refused[:3]}"

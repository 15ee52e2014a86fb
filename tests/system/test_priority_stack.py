"""Tier precedence through a real stack (issue 3, item 7): with a free-tier flood and a deferred backlog present, paid
requests on llmq-sim (fixed 500 ms per batch) finish with p99 under 3 batch times.

The stack (two API pods, batcher, two llmq-sim workers, result-router) runs on the suite's Kafka and Redis
(tests/conftest.py), or, when the environment names other ones, on a private Kafka and Redis of its own (25192 / 25479)
so that its backlog and flood disturb nobody. The deferred backlog goes straight to Kafka with Kafka replies to a topic of
this test; its deadlines end soon after the module so that a later stack on the same Kafka expires rather than serves it.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from llmq_cli.devstack import StackConfig
from llmq_core import constants, kafka, wire
from tests import ports
from tests.stacks import standalone_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]  # latency bounds: the machine to itself

ROOT = Path(__file__).resolve().parents[2]
BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
PRIVATE = dict(state_dir=ROOT / "var" / "priority-test", kafka_port=BASE + 30, redis_port=BASE + 35)
BATCH_TIME_MS = 500
SHAPE = dict(api_ports=API_PORTS, tiny_workers=0, sim_workers=2, sim_batch_time_ms=BATCH_TIME_MS, sim_max_batch_size=8)
PAID_KEY, FREE_KEY = "llmq-dev-key", "llmq-dev-free-key"
BACKLOG = 2000
BACKLOG_TTL_MS = 150_000  # far past this test's window, short enough that a later stack only expires what is left
FLOOD_IN_FLIGHT = 24  # above the 2 x 8 / 0.5 s = 32 req/s the workers serve, with little CPU for the pipeline itself
PAID_COUNT = 40
PAID_SPACING_S = 0.3  # 40 paid requests over 12 s
PAID_MAX_TOKENS = 16
FLOOD_LEAD_S = 2.0  # the flood fills the workers before the first paid request


@pytest.fixture(scope="module")
def stack(infra):
    with standalone_stack(infra, PRIVATE, **SHAPE) as running:
        yield running


def sim_answer(prompt: str, max_tokens: int) -> str:
    """llmq-sim's completion: the prompt's own bytes from its start, cycled, ``max_tokens`` of them."""
    data = prompt.encode()
    return bytes(data[i % len(data)] for i in range(max_tokens)).decode("utf-8", errors="ignore")


def nearest_rank(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (NaN when ``values`` is empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


async def produce_backlog(cfg: StackConfig, count: int) -> str:
    """``count`` deferred requests straight to Kafka, replies to a new topic of this test; returns that topic."""
    reply_topic = f"priority-test-replies-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(reply_topic, 1, 1)])
    finally:
        await admin.close()
    producer = kafka.make_producer(cfg.settings(), linger_ms=20)
    await producer.start()
    try:
        now_ms = int(time.time() * 1000)
        reply = wire.KafkaReply(topic=reply_topic, content_type=constants.CONTENT_TYPE_MSGPACK)
        requests = [
            wire.GenerationRequest(
                request_id=f"backlog-{uuid.uuid4().hex}",
                tenant_id="backlog",
                traffic_class="deferred",
                tier="paid",
                model="llmq-sim",
                prompt=f"deferred backlog {i}",
                sampling=wire.SamplingParams(max_tokens=8),
                created_ms=now_ms,
                deadline_ms=now_ms + BACKLOG_TTL_MS,
                reply_to=reply,
            )
            for i in range(count)
        ]
        topic = constants.requests_topic("deferred")
        await asyncio.gather(*(kafka.send_message(producer, topic, r, key=r.request_id) for r in requests))
    finally:
        await producer.stop()
    return reply_topic


async def complete(client: httpx.AsyncClient, port: int, key: str, prompt: str, max_tokens: int) -> httpx.Response:
    return await client.post(
        f"http://127.0.0.1:{port}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "llmq-sim", "prompt": prompt, "max_tokens": max_tokens},
    )


async def timed_paid(client: httpx.AsyncClient, i: int) -> tuple[float, str, httpx.Response]:
    """One paid request; returns (end-to-end latency in ms, its prompt, its response)."""
    prompt = f"paid {i} {uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    response = await complete(client, API_PORTS[i % 2], PAID_KEY, prompt, PAID_MAX_TOKENS)
    return (time.monotonic() - started) * 1000, prompt, response


async def flood(client: httpx.AsyncClient, slot: int, stop: asyncio.Event, statuses: Counter, wrong: list) -> None:
    """Free-tier requests back to back on one of the flood's slots until ``stop``; counts statuses, keeps wrong answers."""
    n = 0
    while not stop.is_set():
        prompt = f"free {slot}-{n}"
        n += 1
        response = await complete(client, API_PORTS[slot % 2], FREE_KEY, prompt, 8)
        statuses[response.status_code] += 1
        if response.status_code == 200 and response.json()["choices"][0]["text"] != sim_answer(prompt, 8):
            wrong.append((prompt, response.text))
        elif response.status_code != 200:
            await asyncio.sleep(0.05)  # a 429 comes back at once: no hot loop on two shared cores


async def server_timings(cfg: StackConfig, request_ids: list[str]) -> list[wire.Timings]:
    """The stored FinalResults' timings (queued_ms: created to engine start; total_ms: created to end), for the report."""
    redis = Redis.from_url(cfg.redis_url)
    try:
        for _ in range(20):  # the result-router may lag behind the held connections' answers
            stored = await redis.mget([constants.result_key(r) for r in request_ids])
            if None not in stored:
                break
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()
    return [wire.decode(raw, constants.CONTENT_TYPE_MSGPACK).timings for raw in stored if raw is not None]


async def test_paid_p99_under_three_batch_times_with_free_flood_and_deferred_backlog(stack):
    limits = httpx.Limits(max_connections=FLOOD_IN_FLIGHT + PAID_COUNT, max_keepalive_connections=FLOOD_IN_FLIGHT)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        idle = [await timed_paid(client, i) for i in range(4)]  # warm-up; also the pipeline's latency with no load
        assert all(r.status_code == 200 for _, _, r in idle), [r.text for _, _, r in idle]
        await produce_backlog(stack.cfg, BACKLOG)
        stop, statuses, wrong = asyncio.Event(), Counter(), []
        flooders = [asyncio.create_task(flood(client, slot, stop, statuses, wrong)) for slot in range(FLOOD_IN_FLIGHT)]
        try:
            await asyncio.sleep(FLOOD_LEAD_S)
            paid = []
            for i in range(PAID_COUNT):  # open loop: each on its schedule, whatever the earlier ones are doing
                paid.append(asyncio.create_task(timed_paid(client, 100 + i)))
                await asyncio.sleep(PAID_SPACING_S)
            results = await asyncio.gather(*paid)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*flooders), timeout=60)

    for _, prompt, response in results:
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (sim_answer(prompt, PAID_MAX_TOKENS), "length")
    latencies = [ms for ms, _, _ in results]
    p50, p99 = nearest_rank(latencies, 50), nearest_rank(latencies, 99)
    timings = await server_timings(stack.cfg, [r.json()["id"] for _, _, r in results])
    queued, total = [t.queued_ms for t in timings], [t.total_ms for t in timings]
    report = (
        f"paid p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(latencies):.0f} ms over {len(latencies)} "
        f"(in send order: {[round(ms) for ms in latencies]}); server-side over {len(timings)}: queued p50/p99 "
        f"{nearest_rank(queued, 50)}/{nearest_rank(queued, 99)} ms, total p50/p99 "
        f"{nearest_rank(total, 50)}/{nearest_rank(total, 99)} ms; "
        f"idle {[round(ms) for ms, _, _ in idle]} ms; free flood statuses {dict(statuses)}"
    )
    print(report)
    assert not wrong, wrong[:3]
    assert statuses[200] > 0 and set(statuses) <= {200, 429}, report
    assert p99 < 3 * BATCH_TIME_MS, report

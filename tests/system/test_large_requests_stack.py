"""QA finding 3 through a real stack: one tenant's large but legal requests (llmq-sim, n=128 x max_tokens=8190, ~1 MiB
of text each) do not take the model down for another tenant. While they run, every llmq-sim worker keeps heartbeating
(no gap near the batcher's worker timeout, so the model never looks gone: no 503 model_unavailable), and the other
tenant's small requests keep succeeding within a bound.

Before the fix each such request cost ~2.3 CPU s of per-token Python work in the worker's event loop, in one slice per
tick; the workers stopped heartbeating and the other tenant's requests ended 503/504.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict

import httpx
import pytest
from redis.asyncio import Redis

from llmq_cli.devstack import DevStack
from llmq_core import constants, wire
from llmq_core.settings import Settings
from tests import ports

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]  # latency bounds: the machine to itself

BASE = ports.block()
API_PORTS = (BASE, BASE + 1)  # metrics: result-router +10, batcher +11, workers +12, +13
SHAPE = dict(api_ports=API_PORTS, tiny_workers=0, sim_workers=2, sim_batch_time_ms=500)
BIG_KEY, SMALL_KEY = "llmq-dev-key", "llmq-dev-free-key"
BIG_COUNT = 12
BIG_BODY = {"model": "llmq-sim", "prompt": "x", "max_tokens": 8190, "n": 128}
SMALL_COUNT = 20
SMALL_BOUND_S = 10.0  # each small request, end to end (idle: one 500 ms batch)
HEARTBEAT_GAP_BOUND_MS = (
    Settings().batcher.worker_heartbeat_timeout_ms // 2
)  # half the time after which a worker is gone


@pytest.fixture(scope="module")
def stack(infra):
    if infra is None:
        pytest.skip("needs the suite's own Kafka and Redis")
    running = DevStack(dataclasses.replace(infra.cfg, **SHAPE))
    try:
        running.up(timeout_s=240, log=lambda *_: None)
        yield running
    finally:
        running.down(services_only=True)


async def watch_heartbeats(redis_url: str, gaps_ms: dict[str, int], stop: asyncio.Event) -> None:
    """Largest gap between two heartbeats of each llmq-sim worker, as received, until ``stop``."""
    redis = Redis.from_url(redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(constants.REDIS_HEARTBEATS_CHANNEL)
    last: dict[str, float] = {}
    try:
        while not stop.is_set():
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is None:
                continue
            beat = wire.decode(message["data"])
            if isinstance(beat, wire.WorkerHeartbeat) and beat.model == "llmq-sim":
                now = time.monotonic()
                if beat.worker_id in last:
                    gaps_ms[beat.worker_id] = max(gaps_ms[beat.worker_id], round((now - last[beat.worker_id]) * 1000))
                last[beat.worker_id] = now
    finally:
        await pubsub.aclose()
        await redis.aclose()


async def post(client: httpx.AsyncClient, i: int, key: str, body: dict) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = await client.post(
        f"http://127.0.0.1:{API_PORTS[i % 2]}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}", "x-llmq-timeout-ms": "60000"},
    )
    return time.monotonic() - started, response


async def small_requests(client: httpx.AsyncClient) -> list[tuple[float, httpx.Response]]:
    """The other tenant's small requests, four at a time."""
    out = []
    for first in range(0, SMALL_COUNT, 4):
        out += await asyncio.gather(
            *(
                post(client, i, SMALL_KEY, {"model": "llmq-sim", "prompt": f"small {i}", "max_tokens": 4})
                for i in range(first, first + 4)
            )
        )
    return out


async def test_large_requests_of_one_tenant_leave_the_model_up_for_another(stack):
    gaps_ms: dict[str, int] = defaultdict(int)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_heartbeats(stack.cfg.redis_url, gaps_ms, stop))
    async with httpx.AsyncClient(timeout=90) as client:
        bigs = [asyncio.create_task(post(client, i, BIG_KEY, BIG_BODY)) for i in range(BIG_COUNT)]
        await asyncio.sleep(1.0)  # the large requests reach the workers first
        smalls = await small_requests(client)
        big_results = await asyncio.gather(*bigs)
    stop.set()
    await watcher

    small_statuses = [r.status_code for _, r in smalls]
    assert small_statuses == [200] * SMALL_COUNT, [r.text[:200] for _, r in smalls if r.status_code != 200]
    assert max(s for s, _ in smalls) < SMALL_BOUND_S, sorted(round(s, 2) for s, _ in smalls)
    for _, response in big_results:
        assert response.status_code == 200, response.text[:300]
        choices = response.json()["choices"]
        assert len(choices) == 128 and {c["finish_reason"] for c in choices} == {"length"}
    assert len(gaps_ms) == SHAPE["sim_workers"], gaps_ms
    assert max(gaps_ms.values()) < HEARTBEAT_GAP_BOUND_MS, gaps_ms

"""The API pod's Redis pieces against a real Redis: the token-bucket Lua script, idempotency claims, saturation."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from llmq_api.auth import Principal
from llmq_api.idempotency import Claim, IdempotencyStore
from llmq_api.ratelimit import RateLimiter
from llmq_api.saturation import SaturationMonitor
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from tests.stacks import RATE_LIMIT_TIMEOUT_MS

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis():
    client = Redis.from_url(Settings().redis.url)
    yield client
    await client.aclose()


def tenant(**limits: int) -> Principal:
    return Principal(tenant_id=f"apitest-{uuid.uuid4().hex[:8]}", **limits)


def limiter_of(redis: Redis, clock: FakeClock) -> RateLimiter:
    """A limiter that waits out a loaded machine's stalls instead of failing open."""
    return RateLimiter(redis, clock, timeout_s=RATE_LIMIT_TIMEOUT_MS / 1000)


async def test_request_bucket_holds_a_minute_and_refills_continuously(redis):
    clock, who = FakeClock(), tenant(requests_per_min=3)
    limiter = limiter_of(redis, clock)
    assert [await limiter.acquire(who, 1) for _ in range(3)] == [None, None, None]
    refused = await limiter.acquire(who, 1)
    assert refused.reason == "tenant_requests" and refused.error.headers["retry-after"] == "20"  # 1 per 20 s
    clock.advance(19_000)
    assert (await limiter.acquire(who, 1)).error.headers["retry-after"] == "1"
    clock.advance(1_000)
    assert await limiter.acquire(who, 1) is None
    assert await limiter.acquire(who, 1) is not None
    pttl = await redis.pttl(constants.ratelimit_key(who.tenant_id, "requests"))
    assert 0 < pttl <= 60_000


async def test_token_bucket_charges_the_estimate_and_a_refusal_takes_nothing(redis):
    clock, who = FakeClock(), tenant(requests_per_min=100, tokens_per_min=600)
    limiter = limiter_of(redis, clock)
    assert await limiter.acquire(who, 500) is None
    refused = await limiter.acquire(who, 200)  # 100 left, 10 per second: 10 s to go
    assert refused.reason == "tenant_tokens" and refused.error.headers["retry-after"] == "10"
    assert await limiter.acquire(who, 100) is None  # the refusal took neither tokens nor a request
    clock.advance(60_000)
    assert await limiter.acquire(who, 10_000) is None  # larger than the bucket: charged as a full bucket
    assert await limiter.acquire(who, 1) is not None


async def test_pods_share_the_buckets(redis):
    clock, who = FakeClock(), tenant(requests_per_min=4)
    pods = [limiter_of(redis, clock), limiter_of(redis, clock)]
    results = await asyncio.gather(*(pods[i % 2].acquire(who, 1) for i in range(10)))
    assert sum(r is None for r in results) == 4


async def test_idempotency_claims_expire_and_release_only_their_own(redis):
    clock = FakeClock()
    store = IdempotencyStore(redis, clock, result_ttl_ms=5_000)
    owner, key = f"apitest-{uuid.uuid4().hex[:8]}", "k"
    mine = Claim(request_id="cmpl-a", fingerprint="f", deadline_ms=clock.now_ms() + 10_000)
    assert await store.claim(owner, key, mine) is None
    assert await store.claim(owner, key, Claim(request_id="cmpl-b", fingerprint="f", deadline_ms=0)) == mine
    assert 14_000 < await redis.pttl(constants.idempotency_key(owner, key)) <= 15_000  # deadline + result TTL
    await store.release(owner, key, "cmpl-b")
    assert await store.find(owner, key) == mine
    await store.release(owner, key, "cmpl-a")
    assert await store.find(owner, key) is None


async def test_saturation_monitor_reads_batcher_reports(redis):
    key = f"apitest-saturation-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(10_000_000)
    report = wire.BatcherSaturation(
        batcher_id="b",
        sent_ms=clock.now_ms(),
        models={"llmq-sim": wire.ModelLoad(classes={"near_interactive": wire.QueueLoad(depth=7, oldest_age_ms=2_500)})},
    )
    await redis.hset(key, "b", wire.encode(report))
    try:
        monitor = SaturationMonitor(redis, clock, stale_ms=5_000, key=key)
        await monitor.refresh()
        prediction = monitor.current.predict("llmq-sim", "deferred")  # no worker: the oldest age ahead is the wait
        assert (prediction.queued, prediction.wait_ms) == (7, 2_500)
    finally:
        await redis.delete(key)

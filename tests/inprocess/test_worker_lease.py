"""One worker per partition of llmq.batches (llmq_worker.lease) on the real Redis: a lease whose holder is on another
host (not known to be gone) is taken only once it lapsed. The standby of a second worker process:
tests/system/test_worker_standby.py."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import pytest
import redis.asyncio as aioredis

from llmq_core.constants import worker_lease_key
from llmq_worker.lease import Holder, PartitionLease, this_process

pytestmark = pytest.mark.integration

PARTITION = 12  # of llmq.batches: no stack worker and no other test's worker reads it


async def until(condition, bound_s: float = 60) -> None:
    async with asyncio.timeout(bound_s):
        while not await condition():
            await asyncio.sleep(0.05)


async def test_a_lease_held_from_another_host_is_taken_only_once_it_lapsed(settings):
    redis = aioredis.from_url(settings.redis.url)
    key = worker_lease_key(PARTITION)
    elsewhere = Holder(worker_id="remote", pid=1, host=f"elsewhere-{uuid.uuid4().hex[:6]}")
    try:
        await redis.set(key, msgspec.json.encode(elsewhere), px=1500)
        lease = PartitionLease(redis, PARTITION, this_process("local"), ttl_ms=600)
        started_s = time.monotonic()
        await asyncio.wait_for(lease.acquire(), 30)
        assert time.monotonic() - started_s >= 1.0  # not before the remote holder's lease lapsed (1.5 s, less a poll)
        await redis.delete(key)  # Redis lost it (a restart): the holder takes it again at its next renewal
        stop = asyncio.Event()
        holding = asyncio.create_task(lease.hold(stop))
        await until(lambda: redis.exists(key), bound_s=10)
        await redis.set(key, msgspec.json.encode(elsewhere), px=10_000)  # someone else holds it now: the holder stops
        await asyncio.wait_for(holding, 10)
        await lease.release()
        assert msgspec.json.decode(await redis.get(key), type=Holder) == elsewhere  # not ours: left alone
    finally:
        await redis.delete(key)
        await redis.aclose()

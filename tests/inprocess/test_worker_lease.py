"""One worker per partition of llmq.batches (llmq_worker.lease) on the real Redis and Kafka: a second worker process
given a held partition waits as its standby, consuming nothing, and serves the partition once the first is killed with
SIGKILL; a lease whose holder is on another host (not known to be gone) is taken only once it lapsed."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from llmq_core import wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import worker_lease_key
from llmq_worker.lease import Holder, PartitionLease, this_process
from tests.builders import generation_request

pytestmark = pytest.mark.integration

PARTITION = 12  # of llmq.batches: no stack worker and no other test's worker reads it
MODEL = "llmq-sim-lease-itest"  # no batcher routes real traffic here
TTL_MS = 3000


async def logged(log: Path, text: str, bound_s: float = 60) -> None:
    """Wait until a worker's ``log`` holds ``text``."""
    async with asyncio.timeout(bound_s):
        while text not in log.read_text():
            await asyncio.sleep(0.05)


async def until(condition, bound_s: float = 60) -> None:
    async with asyncio.timeout(bound_s):
        while not await condition():
            await asyncio.sleep(0.05)


async def results_of(consumer, request_ids: set[str], bound_s: float = 60) -> list[wire.FinalResult]:
    """Final results on llmq.results for ``request_ids``, read until each has one."""
    found: list[wire.FinalResult] = []
    async with asyncio.timeout(bound_s):
        while not request_ids <= {r.request_id for r in found}:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                decoded = (wire.decode_record(record.value, record.headers) for record in records)
                found += [m for m in decoded if isinstance(m, wire.FinalResult) and m.request_id in request_ids]
    return found


def one_request(request_id: str) -> wire.GenerationRequest:
    return generation_request(
        request_id,
        now_ms=SYSTEM_CLOCK.now_ms(),
        deadline_in_ms=60_000,
        instance_id="lease-itest-pod",
        model=MODEL,
        prompt="lease",
        sampling=wire.SamplingParams(max_tokens=3),
    )


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

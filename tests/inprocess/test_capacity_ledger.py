"""The capacity ledger in Redis (the batchers' Lua claim, the worker's LedgerWriter) gives the same answers as its rule,
llmq_batcher.ledger.WorkerLedger (which the simulator runs), over a seeded random history of claims, takes and
window changes, for a fixed-time and a continuous-batching worker, against the suite's real Redis."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest
from redis.asyncio import Redis

from llmq_batcher.capacity import SharedCapacity
from llmq_batcher.flights import BatchDispatch
from llmq_batcher.ledger import WorkerLedger
from llmq_core import wire
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_worker.ledger import LedgerWriter
from tests.builders import generation_request

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
SLOTS, BATCH_MS = 8, 500


def beat(fixed: bool, running: int, queued: int) -> wire.WorkerHeartbeat:
    return wire.WorkerHeartbeat(
        worker_id="w",
        partition=0,
        model="llmq-sim",
        max_slots=SLOTS,
        running=running,
        queued=queued,
        free_slots=max(SLOTS - running - queued, 0),
        est_drain_ms=0,
        sent_ms=T0,
        fixed_batch_time_ms=BATCH_MS if fixed else 0,
    )


def _branch(model: WorkerLedger, now_ms: int, want: int, lead_ms: int, margin_ms: int) -> str:
    """Which of the rule's branches a claim at ``now_ms`` takes."""
    if not model.fixed:
        room = model.room(now_ms)
        return "all" if want <= room else "part" if room else "none"
    if not (model.running or model.queued or model.room(now_ms) < model.max_slots) or model.ends_ms <= now_ms:
        return "idle"
    return "early" if now_ms < model.ends_ms - lead_ms else "late" if now_ms > model.ends_ms - margin_ms else "lead"


def batch(batch_id: str, requests: int) -> BatchDispatch:
    request = generation_request("r", now_ms=T0)
    return BatchDispatch(batch_id, "w", 0, "llmq-sim", [request] * requests, "size", T0)


@pytest.mark.parametrize("fixed", [True, False])
async def test_the_redis_ledger_answers_as_its_rule_does(fixed):
    settings = Settings(batcher={"worker_queue_bound": 3})
    names = Names(capacity_prefix=f"test:capacity:{uuid.uuid4().hex[:8]}:")
    redis = Redis.from_url(settings.redis.url)
    claims, writer = SharedCapacity(redis, names, settings), LedgerWriter(redis, names, "w")
    model = WorkerLedger(SLOTS, fixed, BATCH_MS if fixed else 0, queue_bound=3)
    ttl_ms, lead_ms, margin_ms = (
        settings.batcher.capacity_grant_ttl_ms,
        max(settings.batcher.fixed_engine_leads_ms),
        settings.batcher.dispatch_margin_ms,
    )
    rng = random.Random(28)
    now_ms, running, queued, ends_ms, granted, outcomes = T0, 0, 0, 0, [], Counter()
    try:
        await writer.write(beat(fixed, 0, 0), 0)
        for step in range(1500):
            now_ms += rng.choice((1, 2, 4, 8, 16, 32, 64))
            if fixed and running and now_ms >= ends_ms or not running and queued:  # a window ends, the next starts
                running = min(queued, SLOTS)
                queued -= running
                ends_ms = now_ms + BATCH_MS if fixed and running else 0
                model.holds(running, queued, ends_ms)
                await writer.write(beat(fixed, running, queued), ends_ms)
            elif not fixed and running and rng.random() < 0.2:  # a continuous worker's request ends
                running -= 1
                model.holds(running, queued)
                await writer.write(beat(fixed, running, queued), 0)
            if rng.random() < 0.6:
                batch_id, want = f"b{step}", rng.randint(1, 2 * SLOTS)
                outcomes[_branch(model, now_ms, want, lead_ms, margin_ms)] += 1
                expected = model.claim(batch_id, want, now_ms, ttl_ms, lead_ms, margin_ms)
                got = await claims.claim(batch(batch_id, want), now_ms)
                assert got == expected, (step, want, model)
                if got.granted:
                    granted.append((batch_id, got.granted))
            elif granted:  # the worker takes a batch
                batch_id, n = granted.pop(rng.randrange(len(granted)))
                queued += n
                model.took(batch_id, running, queued)
                await writer.write(beat(fixed, running, queued), ends_ms, took=batch_id)
        assert min(outcomes.values()) >= 5 and len(outcomes) == (4 if fixed else 3), outcomes  # every branch, often
    finally:
        await redis.delete(*names.capacity_keys("w"))
        await redis.aclose()


async def test_a_worker_without_a_ledger_is_claimed_without_a_bound():
    settings = Settings()
    names = Names(capacity_prefix=f"test:capacity:{uuid.uuid4().hex[:8]}:")
    redis = Redis.from_url(settings.redis.url)
    try:
        grant = await SharedCapacity(redis, names, settings).claim(batch("b", 500), T0)
        assert grant.granted == 500
    finally:
        await redis.aclose()

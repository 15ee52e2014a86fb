"""The capacity ledger in Redis (the batchers' Lua claim, the worker's LedgerWriter) gives the same answers as its rule,
llmq_batcher.ledger.WorkerLedger (which the simulator runs), over a seeded random history of claims, takes and
window changes, for a fixed-time and a continuous-batching worker (its preemptible room too, for batches without deferred
requests), against the suite's real Redis."""

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


def beat(fixed: bool, running: int, queued: int, preemptible: int = 0) -> wire.WorkerHeartbeat:
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
        preemptible=preemptible,
    )


def _branch(model: WorkerLedger, now_ms: int, want: int, lead_ms: int, margin_ms: int, urgent: bool) -> str:
    """Which of the rule's branches a claim at ``now_ms`` takes."""
    if not model.fixed:
        room = model.room(now_ms, urgent)
        branch = "all" if want <= room else "part" if room else "none"
        return f"{branch}+preemptible" if urgent and room > model.room(now_ms) else branch
    if not (model.running or model.queued or model.room(now_ms) < model.max_slots) or model.ends_ms <= now_ms:
        return "idle"
    return "early" if now_ms < model.ends_ms - lead_ms else "late" if now_ms > model.ends_ms - margin_ms else "lead"


def batch(batch_id: str, requests: int, urgent: bool = True) -> BatchDispatch:
    """A batch of ``requests`` interactive requests (``urgent``), else with a deferred one among them."""
    request = generation_request("r", now_ms=T0)
    deferred = generation_request("d", now_ms=T0, traffic_class="deferred")
    return BatchDispatch(
        batch_id, "w", 0, "llmq-sim", [request] * (requests - 1) + [request if urgent else deferred], "size", T0
    )


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
    now_ms, running, queued, preemptible, ends_ms, granted, outcomes = T0, 0, 0, 0, 0, [], Counter()
    try:
        await writer.write(beat(fixed, 0, 0), 0)
        for step in range(1500):
            now_ms += rng.choice((1, 2, 4, 8, 16, 32, 64))
            if fixed and running and now_ms >= ends_ms or not running and queued:  # a window ends, the next starts
                running = min(queued, SLOTS)
                queued -= running
                ends_ms = now_ms + BATCH_MS if fixed and running else 0
                preemptible = 0 if fixed else rng.randint(0, running)  # of them deferred, the worker would preempt
                model.holds(running, queued, ends_ms, preemptible)
                await writer.write(beat(fixed, running, queued, preemptible), ends_ms)
            elif not fixed and running and rng.random() < 0.2:  # a continuous worker's request ends
                running -= 1
                preemptible = min(preemptible, running)
                model.holds(running, queued, preemptible=preemptible)
                await writer.write(beat(fixed, running, queued, preemptible), 0)
            if rng.random() < 0.6:
                batch_id, want, urgent = f"b{step}", rng.randint(1, 2 * SLOTS), rng.random() < 0.5
                outcomes[_branch(model, now_ms, want, lead_ms, margin_ms, urgent)] += 1
                expected = model.claim(batch_id, want, now_ms, ttl_ms, lead_ms, margin_ms, urgent)
                got = await claims.claim(batch(batch_id, want, urgent), now_ms)
                assert got == expected, (step, want, urgent, model)
                if got.granted:
                    granted.append((batch_id, got.granted))
            elif granted:  # the worker takes a batch
                batch_id, n = granted.pop(rng.randrange(len(granted)))
                queued += n
                model.took(batch_id, running, queued, preemptible)
                await writer.write(beat(fixed, running, queued, preemptible), ends_ms, took=batch_id)
        assert min(outcomes.values()) >= 5 and len(outcomes) == (4 if fixed else 5), outcomes  # every branch, often
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


async def test_an_urgent_batch_gets_the_preemptible_room_an_older_workers_ledger_does_not_write():
    settings = Settings(batcher={"worker_queue_bound": 3})
    names = Names(capacity_prefix=f"test:capacity:{uuid.uuid4().hex[:8]}:")
    redis = Redis.from_url(settings.redis.url)
    claims, writer = SharedCapacity(redis, names, settings), LedgerWriter(redis, names, "w")
    ledger_key, grants_key = names.capacity_keys("w")
    try:
        await writer.write(beat(False, SLOTS, 0, preemptible=2), 0)  # full, 2 of its running deferred preemptible
        assert (await claims.claim(batch("deferred", 10, urgent=False), T0)).granted == 3  # the queue bound only
        await redis.delete(grants_key)
        assert (await claims.claim(batch("urgent", 10), T0)).granted == 5  # and the preemptible room
        await redis.delete(grants_key)
        await redis.hdel(ledger_key, "preemptible")  # an older worker's ledger
        assert (await claims.claim(batch("older", 10), T0)).granted == 3
    finally:
        await redis.delete(*names.capacity_keys("w"))
        await redis.aclose()

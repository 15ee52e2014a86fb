"""Prefix-aware dispatch through a real broker and Redis: two workers each announce a different warm prefix on the
heartbeats channel (PrefixSummary, as llmq_worker publishes it); requests go to the holder of theirs, and elsewhere
once the holder is loaded past LLMQ_BATCHER_PREFIX_AFFINITY_MAX_LOAD. Counts from the Batch records and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from redis.asyncio import Redis

from llmq_batcher.intake import EntryRules
from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import BatchPolicy, PolicyConfig
from llmq_core import constants, kafka, requests, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.metrics import BatcherMetrics
from llmq_core.prefixes import request_chain
from llmq_core.settings import Settings
from llmq_worker.prefix_cache import PrefixLedger
from tests.builders import heartbeat
from tests.inprocess.test_batcher_loop import MODEL, _create_topics, _names, _request
from tests.stacks import simulated_worker

pytestmark = pytest.mark.integration

SLOTS = 64  # a holder at 8 free (load 0.875) is past the 0.75 threshold; the test's requests never load one that far
WARM = {"w-a": "A" * (8 * constants.PREFIX_BLOCK_BYTES), "w-b": "B" * (8 * constants.PREFIX_BLOCK_BYTES)}
PARTITIONS = {"w-a": 0, "w-b": 1}


async def _announce(redis: Redis, channel: str, free: dict[str, int]) -> None:
    """Every 200 ms each worker's heartbeat (``free[worker]`` slots free) and prefix summary (its warm prompt)."""
    while True:
        now_ms = SYSTEM_CLOCK.now_ms()
        async with redis.pipeline(transaction=False) as pipe:
            for worker_id, prompt in WARM.items():
                beat = heartbeat(
                    MODEL,
                    worker_id=worker_id,
                    partition=PARTITIONS[worker_id],
                    max_slots=SLOTS,
                    running=SLOTS - free[worker_id],
                    sent_ms=now_ms,
                )
                chain = request_chain(_request("warm", "pod", prompt=prompt), True)
                summary = wire.PrefixSummary(
                    worker_id=worker_id,
                    model=MODEL,
                    block_bytes=constants.PREFIX_BLOCK_BYTES,
                    blocks=list(chain),
                    sent_ms=now_ms,
                )
                pipe.publish(channel, wire.encode(beat))
                pipe.publish(channel, wire.encode(summary))
            await pipe.execute()
        await asyncio.sleep(0.2)


async def _until(condition, what: str, bound_s: float = 60) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _batcher(settings: Settings, tag: str, redis: Redis):
    """A BatcherLoop with metrics on the private names of ``tag`` (topics created), running for the block; yields
    (loop, metrics)."""
    names = _names(tag)
    metrics = BatcherMetrics()
    loop = BatcherLoop(
        BatchPolicy(PolicyConfig.defaults(tag)),
        kafka.make_consumer(settings, group_id=f"test-batcher-{tag}"),
        kafka.RenewableProducer(lambda: kafka.make_producer(settings)),
        redis,
        SYSTEM_CLOCK,
        max_queued=1000,
        names=names,
        metrics=metrics,
        entry=EntryRules(requests.Rules(windows={MODEL: 0})),
    )
    await loop.producer.start()
    loop.subscribe()
    await loop.consumer.start()
    task = asyncio.create_task(loop.run())
    try:
        yield loop, metrics
    finally:
        loop.stop()
        await asyncio.wait_for(task, 15)
        await loop.consumer.stop()
        await loop.producer.stop()


async def _until_held(loop: BatcherLoop, warm: dict[str, str]) -> None:
    """Until the batcher's index has each worker holding all 8 blocks of its warm prompt (``warm``: worker -> it)."""
    chains = {w: request_chain(_request("warm", "pod", prompt=p), True) for w, p in warm.items()}
    await _until(
        lambda: all(loop.policy.prefixes.matched(w, c, SYSTEM_CLOCK.now_ms()) == 8 for w, c in chains.items()),
        "the batcher never took both workers' summaries",
    )


@contextlib.asynccontextmanager
async def _clients():
    """Fresh private topics and clients; yields (settings, tag, names, redis, producer)."""
    settings, tag = Settings(), uuid.uuid4().hex[:8]
    names = _names(tag)
    await _create_topics(settings, names)
    redis = Redis.from_url(settings.redis.url)
    producer = kafka.make_producer(settings)
    await producer.start()
    try:
        yield settings, tag, names, redis, producer
    finally:
        await producer.stop()
        await redis.aclose()


@contextlib.asynccontextmanager
async def _stack():
    """A batcher on fresh private topics and the two announcing workers; yields (names, producer, loop, metrics, free)
    where ``free`` sets what each worker's next heartbeats say is free."""
    free = dict.fromkeys(WARM, SLOTS)
    async with _clients() as (settings, tag, names, redis, producer), _batcher(settings, tag, redis) as (loop, metrics):
        announcing = asyncio.create_task(_announce(redis, names.heartbeats_channel, free))
        try:
            await _until_held(loop, WARM)
            yield names, producer, loop, metrics, free
        finally:
            announcing.cancel()


async def _send(producer, names, prompts: dict[str, str]) -> None:
    for request_id, prompt in prompts.items():
        await kafka.send_message(producer, names.request_topics[0], _request(request_id, "pod", prompt=prompt))
    await producer.flush()


async def _workers_of(settings: Settings, topic: str, wanted: set[str], timeout_s: float = 60) -> dict[str, str]:
    """request id -> the worker its Batch record named, for every id of ``wanted`` (from the topic's start)."""
    reader = kafka.make_consumer(settings, topic, group_id=None)
    await reader.start()
    seen: dict[str, str] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while not wanted <= set(seen):
            assert time.monotonic() < deadline, f"never dispatched: {sorted(wanted - set(seen))}"
            for records in (await reader.getmany(timeout_ms=500)).values():
                for record in records:
                    batch = wire.decode(record.value)
                    seen.update({r.request_id: batch.worker_id for r in batch.requests})
        return {request_id: seen[request_id] for request_id in wanted}
    finally:
        await reader.stop()


def _decisions(metrics: BatcherMetrics) -> dict[str, float]:
    """The route decisions counted, by reason, as /metrics shows them."""
    text = metrics.render().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("llmq_batcher_prefix_route_decisions_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="')[1].split('"')[0]] = float(value)
    return out


async def test_requests_go_to_the_holder_of_their_prefix_and_elsewhere_when_it_is_saturated():
    async with _stack() as (names, producer, loop, metrics, free):
        run = uuid.uuid4().hex[:8]
        for worker_id in ("w-b", "w-a"):  # one prefix at a time: a batch goes where its first request's prefix is
            these = {f"{run}-{worker_id}-{i}": WARM[worker_id] + f" question {i}" for i in range(5)}
            await _send(producer, names, these)
            placed = await _workers_of(Settings(), names.batches_topic, set(these))
            assert set(placed.values()) == {worker_id}, placed
        held = _decisions(metrics)
        assert held.get("affinity", 0) >= 2 and not held.get("load_override") and not held.get("no_match"), held

        free["w-a"] = 8  # w-a's load 0.875 from its next heartbeat on
        worker_a = loop.policy._fleet.workers["w-a"]  # the batcher's view: no public accessor is needed elsewhere
        await _until(lambda: worker_a.hb_free == 8, "the batcher never heard w-a saturated")
        later = {f"{run}-late-a{i}": WARM["w-a"] + f" later {i}" for i in range(4)}
        await _send(producer, names, later)
        placed = await _workers_of(Settings(), names.batches_topic, set(later))
        assert set(placed.values()) == {"w-b"}, placed
        after = _decisions(metrics)
        assert after.get("load_override", 0) >= 1, after  # the first: w-b held none of it yet, later ones tie on it
        assert not after.get("no_match"), after


async def test_two_simulated_workers_each_warm_a_prefix_and_later_requests_go_to_its_holder():
    """Real worker loops (llmq-sim without a fixed batch time: continuous batching to the batcher) publish what their
    prefix ledgers hold after one warm batch each, produced straight to their partitions."""
    async with _clients() as (settings, tag, names, redis, producer), contextlib.AsyncExitStack() as stack:
        warm = {f"w-a-{tag}": WARM["w-a"], f"w-b-{tag}": WARM["w-b"]}
        for partition, worker_id in enumerate(warm):
            consumer = kafka.make_consumer(settings, group_id=f"test-prefix-{worker_id}")
            await consumer.start()
            stack.push_async_callback(consumer.stop)
            ledger = PrefixLedger(budget_tokens=100_000)
            await stack.enter_async_context(
                simulated_worker(
                    worker_id,
                    partition,
                    MODEL,
                    batch_time_ms=0,
                    names=names,
                    prefix_ledger=ledger,
                    consumer=consumer,
                    producer=producer,
                    redis=redis,
                )
            )
            batch = wire.Batch(
                batch_id=f"warm-{worker_id}",
                worker_id=worker_id,
                model=MODEL,
                requests=[_request(f"warm-{worker_id}", "pod", prompt=warm[worker_id])],
                formed_ms=SYSTEM_CLOCK.now_ms(),
                flush_reason="size",
            )
            await kafka.send_message(producer, names.batches_topic, batch, key=batch.batch_id, partition=partition)
        async with _batcher(settings, tag, redis) as (loop, metrics):
            await _until_held(loop, warm)
            for worker_id, prompt in warm.items():
                these = {f"{worker_id}-{i}": prompt + f" question {i}" for i in range(5)}
                await _send(producer, names, these)
                placed = await _workers_of(settings, names.batches_topic, set(these))
                assert set(placed.values()) == {worker_id}, placed
            decided = _decisions(metrics)
            assert decided.get("affinity", 0) >= 2 and set(decided) == {"affinity"}, decided

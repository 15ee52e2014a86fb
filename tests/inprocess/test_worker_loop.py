"""The worker loop in-process against the real Kafka and Redis, on its own partition (15) with the simulated engine."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from aiokafka import TopicPartition

from llmq_core import wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import (
    PREFIX_BLOCK_BYTES,
    REDIS_HEARTBEATS_CHANNEL,
    TOPIC_BATCHES,
    TOPIC_RESULTS,
    alive_key,
    replies_channel,
    worker_group,
)
from llmq_core.kafka import make_consumer, make_producer
from llmq_worker.prefix_cache import PrefixLedger
from tests.builders import generation_request
from tests.stacks import send_batch, simulated_worker

pytestmark = pytest.mark.integration

PARTITION = 15
MODEL = "llmq-sim-worker-itest"  # no batcher routes real traffic to this test worker


def request(
    request_id: str, instance_id: str, prompt: str, *, stream: bool, deadline_s: float = 30
) -> wire.GenerationRequest:
    return generation_request(
        request_id,
        now_ms=SYSTEM_CLOCK.now_ms(),
        deadline_in_ms=int(deadline_s * 1000),
        instance_id=instance_id,
        model=MODEL,
        prompt=prompt,
        sampling=wire.SamplingParams(max_tokens=5),
        stream=stream,
    )


async def test_worker_answers_a_batch_on_redis_and_llmq_results(settings):
    run = uuid.uuid4().hex[:8]
    worker_id, instance_id = f"itest-worker-{run}", f"itest-pod-{run}"
    redis = aioredis.from_url(settings.redis.url)
    producer, results = make_producer(settings), make_consumer(settings, group_id=None)
    offsets = make_consumer(settings, group_id=worker_group(PARTITION))
    await asyncio.gather(producer.start(), results.start(), offsets.start())
    result_tps = [TopicPartition(TOPIC_RESULTS, p) for p in range(settings.kafka.results_topic_partitions)]
    results.assign(result_tps)
    await results.seek_to_end(*result_tps)
    for tp in result_tps:
        await results.position(tp)
    pubsub = redis.pubsub()
    await pubsub.subscribe(replies_channel(instance_id), REDIS_HEARTBEATS_CHANNEL)

    worker_consumer = make_consumer(settings, group_id=worker_group(PARTITION))
    await worker_consumer.start()
    clients = {"consumer": worker_consumer, "producer": producer, "redis": redis}
    try:
        async with simulated_worker(worker_id, PARTITION, MODEL, batch_time_ms=100, **clients):
            batch_id = f"b-{run}"
            meta = await send_batch(
                producer,
                batch_id,
                worker_id,
                PARTITION,
                request(f"s-{run}", instance_id, "abc", stream=True),
                request(f"p-{run}", instance_id, "xyz", stream=False),
                request(f"x-{run}", instance_id, "old", stream=False, deadline_s=-1),
            )

            chunks, finals, beats = [], {}, []
            async with asyncio.timeout(20):
                while len(finals) < 3 or not any(b.last_batch_id == batch_id for b in beats):
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is None:
                        continue
                    decoded = wire.decode(message["data"])
                    if isinstance(decoded, wire.TokenChunk):
                        chunks.append(decoded)
                    elif isinstance(decoded, wire.FinalResult):
                        finals[decoded.request_id] = decoded
                    elif isinstance(decoded, wire.WorkerHeartbeat) and decoded.worker_id == worker_id:
                        beats.append(decoded)

            streamed, plain, expired = finals[f"s-{run}"], finals[f"p-{run}"], finals[f"x-{run}"]
            assert (streamed.outcome, streamed.choices[0].text, streamed.usage.total_tokens) == (
                wire.Outcome.SUCCEEDED,
                "abcab",
                8,
            )
            assert "".join(c.text for c in chunks) == "abcab" and {c.request_id for c in chunks} == {f"s-{run}"}
            assert [c.seq for c in chunks] == list(range(len(chunks)))
            assert plain.choices[0].text == "xyzxy"
            assert expired.outcome is wire.Outcome.EXPIRED
            assert {f.batch_size for f in finals.values()} == {3}
            assert {f.worker_id for f in finals.values()} == {worker_id}
            assert streamed.timings.total_ms >= streamed.timings.ttft_ms >= streamed.timings.queued_ms
            assert beats[-1].fixed_batch_time_ms == 100 and beats[-1].partition == PARTITION
            assert await redis.pttl(alive_key("worker", worker_id)) > 0

            logged = {}
            async with asyncio.timeout(20):
                while len(logged) < 3:
                    for records in (await results.getmany(timeout_ms=500)).values():
                        for record in records:
                            result = wire.decode(record.value)
                            if result.request_id in finals:
                                assert record.key.decode() == result.request_id
                                logged[result.request_id] = result
            assert logged == finals

            tp = TopicPartition(TOPIC_BATCHES, PARTITION)
            async with asyncio.timeout(10):
                while (await offsets.committed(tp) or 0) <= meta.offset:
                    await asyncio.sleep(0.1)
        assert await redis.exists(alive_key("worker", worker_id)) == 0
    finally:
        await asyncio.gather(worker_consumer.stop(), offsets.stop(), results.stop(), producer.stop())
        await pubsub.aclose()
        await redis.aclose()


async def test_worker_publishes_its_prefix_cache_and_reports_the_hits_of_a_repeated_prefix(settings):
    """A worker that ran a prompt names its prefix blocks in a PrefixSummary on the heartbeats channel, and the next
    request sharing that prefix reports the cached tokens in its usage."""
    run = uuid.uuid4().hex[:8]
    worker_id, instance_id = f"itest-prefix-worker-{run}", f"itest-prefix-pod-{run}"
    header = f"# shared header {run}\n" + "import x\n" * 60  # over four whole prefix blocks
    redis = aioredis.from_url(settings.redis.url)
    producer = make_producer(settings)
    await producer.start()
    pubsub = redis.pubsub()
    await pubsub.subscribe(replies_channel(instance_id), REDIS_HEARTBEATS_CHANNEL)
    worker_consumer = make_consumer(settings, group_id=worker_group(PARTITION))
    await worker_consumer.start()
    ledger = PrefixLedger(budget_tokens=100_000)
    clients = {"consumer": worker_consumer, "producer": producer, "redis": redis}
    try:
        async with simulated_worker(worker_id, PARTITION, MODEL, batch_time_ms=50, prefix_ledger=ledger, **clients):
            first = request(f"first-{run}", instance_id, header + "def a():", stream=False)
            second = request(f"second-{run}", instance_id, header + "def b():", stream=False)
            await send_batch(producer, f"b1-{run}", worker_id, PARTITION, first)
            finals, summary = await _until(pubsub, worker_id, lambda f, s: f and s is not None)
            assert set(ledger.chain(first)) <= set(summary.blocks)
            assert (summary.model, summary.block_bytes, summary.tenant_scoped) == (MODEL, PREFIX_BLOCK_BYTES, True)
            await send_batch(producer, f"b2-{run}", worker_id, PARTITION, second)
            finals, _ = await _until(pubsub, worker_id, lambda f, s: second.request_id in f)
            shared_blocks = len(header) // PREFIX_BLOCK_BYTES
            assert finals[second.request_id].usage.cached_tokens == shared_blocks * PREFIX_BLOCK_BYTES
    finally:
        await asyncio.gather(worker_consumer.stop(), producer.stop())
        await pubsub.aclose()
        await redis.aclose()


async def _until(pubsub, worker_id: str, done) -> tuple[dict[str, wire.FinalResult], wire.PrefixSummary | None]:
    """Read the pod's replies and the heartbeats channel until ``done(finals, newest summary of worker_id)``."""
    finals, summary = {}, None
    async with asyncio.timeout(20):
        while not done(finals, summary):
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is None:
                continue
            decoded = wire.decode(message["data"])
            if isinstance(decoded, wire.FinalResult):
                finals[decoded.request_id] = decoded
            elif isinstance(decoded, wire.PrefixSummary) and decoded.worker_id == worker_id:
                summary = decoded
    return finals, summary

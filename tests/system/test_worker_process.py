"""The worker as a process (python -m llmq_worker.main) against the real Kafka and Redis, on its own partition (15): a
poisoned request fails alone, SIGTERM drains the running batch."""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest
import redis.asyncio as aioredis
from aiokafka import TopicPartition

from llmq_core import ids, wire
from llmq_core.constants import (
    REDIS_HEARTBEATS_CHANNEL,
    TOPIC_BATCHES,
    replies_channel,
    worker_group,
)
from llmq_core.kafka import make_consumer, make_producer
from tests.inprocess.test_worker_loop import MODEL, PARTITION, request
from tests.stacks import reap, send_batch, worker_process

pytestmark = pytest.mark.integration


async def test_worker_process_isolates_poison_and_drains_on_sigterm(settings):
    """``python -m llmq_worker.main``: a poisoned request fails alone; SIGTERM finishes the running batch, then exits."""
    run = uuid.uuid4().hex[:8]
    worker_id, instance_id = f"itest-proc-{run}", f"itest-pod-{run}"
    qualified = ids.instance_id(settings.region.name, worker_id)  # what the process makes of its --worker-id
    redis = aioredis.from_url(settings.redis.url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(replies_channel(instance_id), REDIS_HEARTBEATS_CHANNEL)
    producer = make_producer(settings)
    await producer.start()
    process = await worker_process(
        settings,
        worker_id,
        PARTITION,
        MODEL,
        *("--batch-time-ms", "300", "--poison-marker", "POISON"),
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        async def next_message(kind):
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                decoded = wire.decode(message["data"]) if message else None
                if isinstance(decoded, kind) and getattr(decoded, "worker_id", qualified) == qualified:
                    return decoded

        async def send(batch_id, *requests):
            return await send_batch(producer, batch_id, worker_id, PARTITION, *requests)

        async with asyncio.timeout(30):
            await next_message(wire.WorkerHeartbeat)
            await send(
                f"poison-{run}",
                *(
                    request(f"{name}-{run}", instance_id, prompt, stream=False)
                    for name, prompt in (("a", "fine"), ("bad", "POISON"), ("b", "also fine"))
                ),
            )
            finals = {}
            while len(finals) < 3:
                result = await next_message(wire.FinalResult)
                finals[result.request_id.split("-")[0]] = result
        assert {name: r.outcome for name, r in finals.items()} == {
            "a": wire.Outcome.SUCCEEDED,
            "bad": wire.Outcome.ERRORED,
            "b": wire.Outcome.SUCCEEDED,
        }
        assert finals["bad"].error.retryable is False and finals["a"].choices[0].text == "finef"

        async with asyncio.timeout(30):
            meta = await send(f"drain-{run}", request(f"d-{run}", instance_id, "draining", stream=True))
            await next_message(wire.TokenChunk)  # the batch is running now
            process.send_signal(signal.SIGTERM)
            drained = await next_message(wire.FinalResult)
            assert (drained.outcome, drained.choices[0].text) == (wire.Outcome.SUCCEEDED, "drain")
            assert await process.wait() == 0
        offsets = make_consumer(settings, group_id=worker_group(PARTITION))
        await offsets.start()
        try:
            assert await offsets.committed(TopicPartition(TOPIC_BATCHES, PARTITION)) == meta.offset + 1
        finally:
            await offsets.stop()
    finally:
        await reap(process)
        await producer.stop()
        await pubsub.aclose()
        await redis.aclose()

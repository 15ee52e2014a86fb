"""Issue 12 item 1 against the real broker: a result the broker refuses ends ``errored`` (result_too_large) for that
request alone, the caller's answer is the llmq.results record, the worker keeps serving; and services refuse to start
when an llmq topic's max.message.bytes is below KAFKA_MAX_MESSAGE_BYTES."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from llmq_core import wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import (
    replies_channel,
    worker_group,
)
from llmq_core.kafka import (
    MAX_MESSAGE_BYTES_CONFIG,
    make_consumer,
    make_producer,
)
from llmq_core.names import Names
from llmq_core.settings import Settings
from tests.stacks import send_batch, simulated_worker

pytestmark = pytest.mark.integration

PARTITION = 14  # of llmq.batches: no stack worker and no other test's worker reads it
MODEL = "llmq-sim-limits-itest"
SMALL_LIMIT_BYTES = 64 << 10


async def set_topic_limit(settings: Settings, topic: str, limit_bytes: int, *, create: bool = False) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        config = {MAX_MESSAGE_BYTES_CONFIG: str(limit_bytes)}
        if create:
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
        else:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
    finally:
        await admin.close()


def request(request_id: str, instance_id: str, *, n: int, max_tokens: int) -> wire.GenerationRequest:
    now = SYSTEM_CLOCK.now_ms()
    return wire.GenerationRequest(
        request_id=request_id,
        model=MODEL,
        prompt="x",
        sampling=wire.SamplingParams(max_tokens=max_tokens, n=n),
        created_ms=now,
        deadline_ms=now + 30_000,
        reply_to=wire.HttpReply(instance_id=instance_id),
    )


async def test_a_result_the_broker_refuses_ends_errored_alone_and_the_worker_keeps_serving(settings):
    run = uuid.uuid4().hex[:8]
    worker_id, instance_id, results_topic = f"itest-limits-{run}", f"itest-pod-{run}", f"itest-results-small-{run}"
    await set_topic_limit(settings, results_topic, SMALL_LIMIT_BYTES, create=True)
    redis = aioredis.from_url(settings.redis.url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(replies_channel(instance_id))
    producer, log_reader = make_producer(settings), make_consumer(settings, results_topic, group_id=None)
    worker_consumer = make_consumer(settings, group_id=worker_group(PARTITION))
    await asyncio.gather(producer.start(), log_reader.start(), worker_consumer.start())
    clients = {"consumer": worker_consumer, "producer": producer, "redis": redis}

    async def answers(count: int) -> dict[str, wire.FinalResult]:
        finals = {}
        while len(finals) < count:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            decoded = wire.decode(message["data"]) if message else None
            if isinstance(decoded, wire.FinalResult):
                finals[decoded.request_id] = decoded
        return finals

    async def send(batch_id: str, *requests: wire.GenerationRequest) -> None:
        await send_batch(producer, batch_id, worker_id, PARTITION, *requests)

    try:
        async with simulated_worker(
            worker_id, PARTITION, MODEL, batch_time_ms=50, names=Names(results_topic=results_topic), **clients
        ) as worker:
            async with asyncio.timeout(30):
                # 16 x 8000 bytes of text: under MAX_RESULT_BYTES and the worker's own record check, over this topic's limit
                await send(
                    f"b1-{run}",
                    request(f"big-{run}", instance_id, n=16, max_tokens=8000),
                    request(f"ok-{run}", instance_id, n=1, max_tokens=5),
                )
                first = await answers(2)
                await send(f"b2-{run}", request(f"after-{run}", instance_id, n=2, max_tokens=3))
                second = await answers(1)
                logged = {}
                while len(logged) < 3:
                    for records in (await log_reader.getmany(timeout_ms=500)).values():
                        logged.update({(r := wire.decode(record.value)).request_id: r for record in records})
            big, ok, after = first[f"big-{run}"], first[f"ok-{run}"], second[f"after-{run}"]
            assert (big.outcome, big.error.code, big.error.retryable, big.choices) == (
                wire.Outcome.ERRORED,
                "result_too_large",
                False,
                [],
            )
            assert big.usage.completion_tokens == 16 * 8000  # the work done is still accounted
            assert (ok.outcome, ok.choices[0].text) == (wire.Outcome.SUCCEEDED, "xxxxx")
            assert (after.outcome, [c.text for c in after.choices]) == (wire.Outcome.SUCCEEDED, ["xxx", "xxx"])
            assert logged == {**first, **second}  # each caller's answer is the durable record, nothing else was logged
            assert not worker.done()
    finally:
        await asyncio.gather(worker_consumer.stop(), log_reader.stop(), producer.stop())
        await pubsub.aclose()
        await redis.aclose()

"""The result-router against a real broker and Redis: stores results, answers Kafka reply topics once."""

import asyncio
import uuid

import msgspec
import pytest
from redis.asyncio import Redis

from llmq_core import constants, kafka, wire
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter

pytestmark = pytest.mark.integration


async def test_stores_and_replies_once_despite_redelivery():
    settings = Settings()
    await kafka.ensure_topics(settings)
    reply_topic = f"test.replies.{uuid.uuid4().hex[:8]}"
    await kafka.create_topic(settings, reply_topic)  # the broker does not auto-create topics
    request_id = f"req-{uuid.uuid4().hex}"
    result = wire.FinalResult(
        request_id=request_id,
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=wire.KafkaReply(topic=reply_topic),
        choices=[wire.Choice(index=0, text="hello", finish_reason="length")],
    )
    redis = Redis.from_url(settings.redis.url)
    producer = kafka.make_producer(settings)
    consumer = kafka.make_consumer(settings, constants.TOPIC_RESULTS, group_id=constants.GROUP_RESULT_ROUTER)
    replies = kafka.make_consumer(settings, reply_topic, group_id=None)
    await producer.start()
    await consumer.start()
    await replies.start()
    router = ResultRouter(settings, consumer, producer, redis)
    task = asyncio.create_task(router.run())
    try:
        for _ in range(2):  # the second copy stands for a redelivery after a crash
            await kafka.send_message(producer, constants.TOPIC_RESULTS, result, key=request_id)
        first = await asyncio.wait_for(replies.getone(), 60)
        assert msgspec.json.decode(first.value)["request_id"] == request_id
        assert dict(first.headers)["content-type"] == b"application/json"
        extra = await replies.getmany(timeout_ms=2000)
        assert not any(extra.values()), "the redelivered result was answered twice"
        stored = await redis.get(constants.result_key(request_id))
        assert wire.decode(stored) == result
    finally:
        router.stop()
        await asyncio.wait_for(task, 10)
        for client in (consumer, replies, producer):
            await client.stop()
        await redis.aclose()

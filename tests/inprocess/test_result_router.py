"""The result-router against a real broker and Redis: stores results, answers Kafka reply topics once."""

import asyncio
import time
import uuid

import msgspec
import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from redis.asyncio import Redis

from llmq_core import constants, kafka, wire
from llmq_core.metrics import RouterMetrics
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from tests.fake_results import succeeded

pytestmark = pytest.mark.integration


async def test_stores_and_replies_once_despite_redelivery():
    settings = Settings()
    await kafka.ensure_topics(settings)
    reply_topic = f"test.replies.{uuid.uuid4().hex[:8]}"
    await kafka.create_topic(settings, reply_topic)  # the broker does not auto-create topics
    request_id = f"req-{uuid.uuid4().hex}"
    result = succeeded(request_id, reply_topic, text="hello")
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


def _keyed_to(prefix: str, partition: int, partitions: int) -> str:
    """A request id that the default partitioner puts on ``partition`` of a topic of ``partitions`` (its reply is
    keyed by it)."""
    every = list(range(partitions))
    return next(
        f"{prefix}-{i}"
        for i in range(10_000)
        if DefaultPartitioner()(f"{prefix}-{i}".encode(), every, every) == partition
    )


async def _recreate(settings: Settings, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again with ``partitions`` (once the broker has let go of the old one)."""
    admin = kafka.make_admin(settings)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        while topic in await admin.list_topics():
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    deadline = time.monotonic() + 30
    while True:  # the deletion may still be under way on the broker: creating refuses until it is done
        try:
            assert await kafka.create_topic(settings, topic, partitions=partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _read(settings: Settings, topic: str, partitions: int, until: int, timeout_s: float) -> list[str]:
    """The request ids of the replies on ``topic`` from its start, once ``until`` are read or ``timeout_s`` passed."""
    reader = kafka.make_consumer(settings, group_id=None)
    await reader.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        ids, deadline = [], time.monotonic() + timeout_s
        while len(ids) < until and time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=100)).values():
                ids += [msgspec.json.decode(r.value)["request_id"] for r in records]
        return ids
    finally:
        await reader.stop()


async def test_a_reply_topic_recreated_with_fewer_partitions_is_answered_once_each_within_the_budget():
    """8 partitions, deleted, created again with 1: the router's producer still knew 8, and 2 of the next 3 replies
    were dead-lettered with NotLeaderForPartitionError after holding their partition 10 s (1 try in 10000 ms)."""
    settings = Settings()
    await kafka.ensure_topics(settings)
    reply_topic = f"test.replies.{uuid.uuid4().hex[:8]}"
    await kafka.create_topic(settings, reply_topic, partitions=8)
    redis = Redis.from_url(settings.redis.url)
    producer = kafka.make_renewable_producer(settings)
    consumer = kafka.make_consumer(settings, constants.TOPIC_RESULTS, group_id=constants.GROUP_RESULT_ROUTER)
    await producer.start()
    await consumer.start()
    metrics = RouterMetrics()
    router = ResultRouter(settings, consumer, producer, redis, metrics=metrics)
    task = asyncio.create_task(router.run())
    tag = uuid.uuid4().hex[:6]
    try:
        warm = [_keyed_to(f"warm-{tag}", p, 8) for p in range(8)]  # the router's producer learns the 8 partitions
        for request_id in warm:
            await kafka.send_message(
                producer, constants.TOPIC_RESULTS, succeeded(request_id, reply_topic, text="hello"), key=request_id
            )
        assert sorted(await _read(settings, reply_topic, 8, len(warm), 60)) == sorted(warm)
        await _recreate(settings, reply_topic, partitions=1)
        after = [_keyed_to(f"after-{tag}", p, 8) for p in (3, 5, 0)]  # of the 8 partitions it knew: 2 are gone
        started = time.monotonic()
        for request_id in after:
            await kafka.send_message(
                producer, constants.TOPIC_RESULTS, succeeded(request_id, reply_topic, text="hello"), key=request_id
            )
        answered = await _read(settings, reply_topic, 1, len(after), 30)
        elapsed_s = time.monotonic() - started
        print(f"3 replies to the recreated topic answered in {elapsed_s:.2f} s")
        assert sorted(answered) == sorted(after), answered
        assert elapsed_s < 2 * len(after), f"{elapsed_s:.1f} s for {len(after)} replies"  # at most 2 s per result
        again = await _read(settings, reply_topic, 1, len(after) + 1, 2)
        assert sorted(again) == sorted(after), "a reply was produced twice"
        dead = [
            metrics.registry.get_sample_value("llmq_reply_dead_letters_total", {"reason": reason})
            for reason in ("retries", "missing_topic", "refused")
        ]
        assert not any(dead), dead
    finally:
        router.stop()
        await asyncio.wait_for(task, 10)
        for client in (consumer, producer):
            await client.stop()
        await redis.aclose()

"""A reply claimed but never marked delivered (its router killed between the broker's append and the mark) is settled by
looking for it in the reply topic, against a real broker and Redis: found, it is not produced again; not found, it is
produced once (llmq_result_router.once)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition
from redis.asyncio import Redis

from llmq_core import constants, ids, kafka, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.metrics import RouterMetrics
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from llmq_result_router.once import Claim, KafkaReplyFinder
from tests.fake_results import succeeded

pytestmark = pytest.mark.integration

REPLY_PARTITIONS = 3  # the search must pick the partition the key maps to


def result(request_id: str, reply_topic: str) -> wire.FinalResult:
    return succeeded(request_id, reply_topic, text="hello")


async def delivered(redis: Redis, request_id: str) -> None:
    while await redis.get(constants.delivered_key(request_id)) != b"1":
        await asyncio.sleep(0.05)


async def replies_by_delivery(settings: Settings, topic: str) -> dict[bytes, int]:
    """Every record of ``topic``, counted by its HEADER_DELIVERY."""
    consumer = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(REPLY_PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        counts: dict[bytes, int] = {}
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for record in records:
                    delivery = dict(record.headers)[constants.HEADER_DELIVERY]
                    counts[delivery] = counts.get(delivery, 0) + 1
        return counts
    finally:
        await consumer.stop()


async def test_an_unmarked_claim_is_settled_by_the_reply_topic_found_or_not():
    settings = Settings()
    tag = uuid.uuid4().hex[:8]
    results_topic, reply_topic = f"test.results.{tag}", f"test.replies.{tag}"
    await kafka.create_topic(settings, results_topic)
    await kafka.create_topic(settings, reply_topic, partitions=REPLY_PARTITIONS)
    landed, lost, sentinel = (f"req-{tag}-{name}" for name in ("landed", "lost", "sentinel"))
    redis = Redis.from_url(settings.redis.url)
    producer = kafka.make_producer(settings)
    consumer = kafka.make_consumer(settings, results_topic, group_id=f"test-router-{tag}", auto_offset_reset="earliest")
    searcher = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False)
    for client in (producer, consumer, searcher):
        await client.start()
    metrics = RouterMetrics()
    router = ResultRouter(
        settings,
        consumer,
        producer,
        redis,
        metrics=metrics,
        instance_id=f"router-b-{tag}",
        finder=KafkaReplyFinder(searcher, producer.partitions_for),
    )
    task = asyncio.create_task(router.run())
    try:
        now_ms = SYSTEM_CLOCK.now_ms()
        dead_claim = Claim(f"router-a-{tag}", now_ms, now_ms + 60_000).encode()  # no alive key: a killed router
        for request_id in (landed, lost):
            await redis.set(constants.delivered_key(request_id), dead_claim, px=60_000)
        # router A's produce of `landed` reached the broker before it died; `lost` never did
        await producer.send_and_wait(
            reply_topic,
            b"{}",
            key=ids.producer_request_id(landed).encode(),
            headers=[(constants.HEADER_DELIVERY, constants.delivered_key(landed).encode())],
        )
        for request_id in (landed, lost, sentinel):
            await kafka.send_message(producer, results_topic, result(request_id, reply_topic), key=request_id)
        await asyncio.wait_for(delivered(redis, sentinel), 60)  # routed in order: the others are done
        counts = await replies_by_delivery(settings, reply_topic)
        assert counts == {constants.delivered_key(r).encode(): 1 for r in (landed, lost, sentinel)}
        assert [await redis.get(constants.delivered_key(r)) for r in (landed, lost)] == [b"1", b"1"]
        assert metrics.reply_searches.labels("found")._value.get() == 1
        assert metrics.reply_searches.labels("not_found")._value.get() == 1
    finally:
        router.stop()
        await asyncio.wait_for(task, 10)
        for client in (consumer, searcher, producer):
            await client.stop()
        await redis.aclose()

"""A record the broker refuses must not break the producer that sent it (real broker).

aiokafka's idempotent producer never takes back the sequence number of a refused record: the next record of that
partition is refused as out of order and its sender task dies. Each topic here takes records up to 64 KiB; each case
sends an accepted record first (without one the broker has no sequence state to find a gap in), then one over the
limit, then more: with kafka.RenewableProducer the worker, the result-router and the API pod keep producing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid

import pytest
import redis.asyncio as aioredis
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, OutOfOrderSequenceNumber
from aiokafka.partitioner import DefaultPartitioner

from llmq_api.pod import KafkaRequestProducer
from llmq_core import constants, kafka, wire
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from tests.inprocess.test_result_limits import MODEL, SMALL_LIMIT_BYTES, request, set_topic_limit
from tests.stacks import send_batch, simulated_worker

pytestmark = pytest.mark.integration

PARTITION = 13  # of llmq.batches: no stack worker and no other test's worker reads it
OVER_LIMIT = b"x" * (2 * SMALL_LIMIT_BYTES)


async def small_topic(settings: Settings, name: str) -> str:
    topic = f"itest-{name}-{uuid.uuid4().hex[:8]}"
    await set_topic_limit(settings, topic, SMALL_LIMIT_BYTES, create=True)
    return topic


async def read(settings: Settings, topic: str, count: int, timeout_s: float = 20) -> list:
    """The first ``count`` records of ``topic`` (partition 0), waiting at most ``timeout_s``."""
    reader = kafka.make_consumer(settings, group_id=None)
    await reader.start()
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        records = []
        async with asyncio.timeout(timeout_s):
            while len(records) < count:
                records += (await reader.getmany(tp, timeout_ms=500)).get(tp, [])
        return records
    finally:
        await reader.stop()


@pytest.mark.parametrize("renewable", [False, True], ids=["aiokafka", "renewable"])
async def test_after_a_refused_record_only_a_renewable_producer_sends_again(settings, renewable):
    """The fault itself (plain aiokafka: if this starts passing, aiokafka fixed it) and the shared remedy."""
    topic = await small_topic(settings, "refusal")
    producer = kafka.make_renewable_producer(settings) if renewable else kafka.make_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"before")
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(topic, OVER_LIMIT)
        if not renewable:
            for _ in range(2):  # the sender task died: every later send fails
                with pytest.raises(OutOfOrderSequenceNumber):
                    await producer.send_and_wait(topic, b"after")
            return
        await producer.send_and_wait(topic, b"after")
        assert producer.renewals == 1
    finally:
        await producer.stop()
    assert [r.value for r in await read(settings, topic, 2)] == [b"before", b"after"]


async def test_the_worker_keeps_producing_results_after_one_is_refused(settings):
    run = uuid.uuid4().hex[:8]
    worker_id, instance_id = f"itest-renewal-{run}", f"itest-pod-{run}"
    results_topic = await small_topic(settings, "results")
    redis = aioredis.from_url(settings.redis.url)
    producer, worker_producer = kafka.make_producer(settings), kafka.make_renewable_producer(settings)
    worker_consumer = kafka.make_consumer(settings, group_id=constants.worker_group(PARTITION))
    await asyncio.gather(producer.start(), worker_producer.start(), worker_consumer.start())
    clients = {"consumer": worker_consumer, "producer": worker_producer, "redis": redis}
    # before: accepted; big: 16 x 8000 bytes of text, over the topic's limit; after: accepted once more
    sizes = {"before": (1, 3), "big": (16, 8000), "after": (2, 3)}
    try:
        async with simulated_worker(
            worker_id, PARTITION, MODEL, batch_time_ms=20, names=Names(results_topic=results_topic), **clients
        ) as worker:
            for done, (name, (n, max_tokens)) in enumerate(sizes.items(), 1):  # in turn: the refusal lands between two
                single = request(f"{name}-{run}", instance_id, n=n, max_tokens=max_tokens)
                await send_batch(producer, f"b-{name}-{run}", worker_id, PARTITION, single)
                records = await read(settings, results_topic, done)
            results = {(r := wire.decode(record.value)).request_id: r for record in records}
            assert not worker.done()
    finally:
        await asyncio.gather(worker_consumer.stop(), producer.stop(), worker_producer.stop())
        await redis.aclose()
    outcomes = {rid.split("-")[0]: (r.outcome, r.error and r.error.code) for rid, r in results.items()}
    assert outcomes == {
        "before": (wire.Outcome.SUCCEEDED, None),
        "big": (wire.Outcome.ERRORED, "result_too_large"),
        "after": (wire.Outcome.SUCCEEDED, None),
    }
    assert worker_producer.renewals == 1


async def test_the_result_router_keeps_replying_after_a_reply_is_refused(settings):
    run = uuid.uuid4().hex[:8]
    results_topic, reply_topic = f"itest-router-results-{run}", await small_topic(settings, "replies")
    await kafka.create_topic(settings, results_topic)
    dead_letters = TopicPartition(constants.TOPIC_DEAD_LETTERS, 0)
    redis = aioredis.from_url(settings.redis.url)
    producer, router_producer = kafka.make_producer(settings), kafka.make_renewable_producer(settings)
    consumer = kafka.make_consumer(settings, results_topic, group_id=f"itest-router-{run}")
    dead_reader = kafka.make_consumer(settings, group_id=None)
    await asyncio.gather(producer.start(), router_producer.start(), consumer.start(), dead_reader.start())
    dead_reader.assign([dead_letters])
    await dead_reader.seek_to_end(dead_letters)
    await dead_reader.position(dead_letters)  # resolved now: only dead letters from here on are read
    router = ResultRouter(settings, consumer, router_producer, redis)
    routing = asyncio.create_task(router.run())
    try:
        for name, chars in (("before", 3), ("big", len(OVER_LIMIT)), ("after", 3)):
            result = wire.FinalResult(
                request_id=f"{name}-{run}",
                outcome=wire.Outcome.SUCCEEDED,
                model=MODEL,
                reply_to=wire.KafkaReply(topic=reply_topic),
                choices=[wire.Choice(index=0, text="x" * chars, finish_reason="length")],
            )
            await kafka.send_message(producer, results_topic, result, key=result.request_id)
        replies = [
            wire.decode(r.value, constants.CONTENT_TYPE_JSON).request_id for r in await read(settings, reply_topic, 2)
        ]
        dead = []
        async with asyncio.timeout(20):
            while f"big-{run}".encode() not in dead:
                dead += [r.key for r in (await dead_reader.getmany(timeout_ms=500)).get(dead_letters, [])]
    finally:
        router.stop()
        await asyncio.wait_for(routing, 10)
        await asyncio.gather(producer.stop(), router_producer.stop(), consumer.stop(), dead_reader.stop())
        await redis.aclose()
    assert replies == [f"before-{run}", f"after-{run}"]  # the refused one is dead-lettered, the next is replied
    assert router_producer.renewals == 1


def same_partition_ids(prefix: str, names: list[str], partitions: int) -> list[str]:
    """Request ids, one per name, that Kafka's default partitioner puts in one partition (of ``partitions``)."""
    partitioner, ids = DefaultPartitioner(), []
    for name in names:
        for n in itertools.count():
            candidate = f"{name}-{prefix}-{n}"
            if partitioner(candidate.encode(), list(range(partitions)), list(range(partitions))) == 0:
                ids.append(candidate)
                break
    return ids


async def test_the_api_pods_producer_keeps_producing_after_a_request_is_refused(settings):
    """The requests topics take llmq's largest request; one whose limit is lowered under the pod stands for any
    refusal the broker alone makes (a policy, a topic limit changed by its owner)."""
    topic = constants.requests_topic(constants.DEFERRED)
    probe = kafka.make_producer(settings)
    await probe.start()
    try:
        partitions = len(await probe.partitions_for(topic))
    finally:
        await probe.stop()
    before, big, after = same_partition_ids(uuid.uuid4().hex[:8], ["before", "big", "after"], partitions)

    def deferred(request_id: str, prompt: str) -> wire.GenerationRequest:  # long expired: any batcher ends it at once
        return wire.GenerationRequest(
            request_id=request_id,
            model="llmq-sim",
            prompt=prompt,
            created_ms=0,
            deadline_ms=1,
            traffic_class=constants.DEFERRED,
            reply_to=wire.HttpReply(instance_id="itest-renewal-nobody"),
        )

    await set_topic_limit(settings, topic, SMALL_LIMIT_BYTES)
    producer = KafkaRequestProducer(settings)
    try:
        async with asyncio.timeout(20):
            await producer.run()
        await producer.produce(deferred(before, "x"))
        with pytest.raises(MessageSizeTooLargeError):
            await producer.produce(deferred(big, OVER_LIMIT.decode()))
        await producer.produce(deferred(after, "x"))
        assert producer.ready
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        await kafka.ensure_topics(settings, raise_limits=True)

"""send_reply: a reply waits for its ack only while its partition exists; one whose partition a metadata update shows
gone (the topic created again with fewer partitions) goes to the partition its key maps to now, once."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import errors
from aiokafka.partitioner import DefaultPartitioner

from llmq_result_router.reply_producer import send_reply
from tests.fakes import FakeClient, FakeCluster

TOPIC = "team.replies"
EIGHT = list(range(8))


class Broker:
    """A producer that knows ``TOPIC`` with 8 partitions; a send's ack stays pending until the test settles it."""

    def __init__(self) -> None:
        self.client = FakeClient(FakeCluster())
        self.client.cluster.partitions[TOPIC] = set(EIGHT)
        self.sends: list[tuple[int, asyncio.Future]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return self.client.cluster.partitions_for_topic(topic)

    async def send(self, topic, value, key=None, partition=None, headers=None) -> asyncio.Future:
        assert partition in self.client.cluster.partitions_for_topic(topic)  # as aiokafka asserts
        ack = asyncio.get_running_loop().create_future()
        self.sends.append((partition, ack))
        return ack


def key_on(partition: int) -> bytes:
    return next(key for i in range(10_000) if DefaultPartitioner()(key := f"k{i}".encode(), EIGHT, EIGHT) == partition)


async def sent(broker: Broker, count: int) -> None:
    while len(broker.sends) < count:
        await asyncio.sleep(0)


async def test_a_reply_whose_partition_is_gone_goes_to_the_one_its_key_maps_to_now():
    broker = Broker()
    reply = asyncio.create_task(send_reply(broker, TOPIC, b"v", key_on(5), [], 1000))
    await sent(broker, 1)
    broker.client.cluster.update(TOPIC, {0})  # the broker said UnknownTopicOrPartition; aiokafka refreshed
    await sent(broker, 2)
    [(first, held), (second, ack)] = broker.sends
    assert (first, second) == (5, 0) and not reply.done()
    ack.set_result(None)
    await asyncio.wait_for(reply, 1)
    held.set_exception(errors.NotLeaderForPartitionError())  # what aiokafka fails the held copy with, 10 s later
    await asyncio.sleep(0)


@pytest.mark.parametrize("partitions", [set(EIGHT), None], ids=["leader election", "topic missing for now"])
async def test_a_reply_whose_partition_exists_or_might_keeps_its_one_send(partitions):
    broker = Broker()
    reply = asyncio.create_task(send_reply(broker, TOPIC, b"v", key_on(5), [], 1000))
    await sent(broker, 1)
    broker.client.cluster.update(TOPIC, partitions)
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(broker.sends) == 1 and not reply.done()  # aiokafka sends it again itself, under its idempotence
    broker.sends[0][1].set_exception(errors.NotLeaderForPartitionError())
    with pytest.raises(errors.NotLeaderForPartitionError):
        await asyncio.wait_for(reply, 1)

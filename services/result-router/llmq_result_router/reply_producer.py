"""One try of a Kafka reply, sent to the partition its key maps to, and sent again while that partition is gone.

A client may delete its reply topic and create it again with fewer partitions (8 -> 1). The router's producer still
holds the old metadata: the partitioner puts a reply on partition 5, the broker answers UnknownTopicOrPartition,
aiokafka refreshes its metadata (now without partition 5) and then holds the record until its request timeout (10 s)
before failing it with NotLeaderForPartitionError. 2 of 3 such replies were dead-lettered that way, each holding its
llmq.results partition 10 s against the documented 2 s per result.

So :func:`send_reply` picks the partition itself (aiokafka's default partitioner over the partitions the producer
knows, as a send without one would) and waits for the ack only while that partition is still in the producer's
metadata: the first metadata update that lacks it ends the wait, and the reply goes to the partition its key maps to
now. The held copy can never be written (its partition is gone), so the reply still goes out once. A partition that
exists (a leader election) keeps its wait: aiokafka sends the record again itself, once, under its idempotence.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaProducer
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.partitioner import DefaultPartitioner

from llmq_core import kafka

_PARTITIONER = DefaultPartitioner()


async def send_reply(
    producer: AIOKafkaProducer,
    topic: str,
    value: bytes,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    metadata_timeout_ms: int,
) -> None:
    """Produce one reply to ``topic``; ``metadata_timeout_ms`` bounds each wait for the topic's partitions
    (UnknownTopicOrPartitionError past it: aiokafka alone would wait its whole request timeout). Raises what the
    send raises; a record a broken producer could not send (BROKEN_PRODUCER_ERRORS: never written) goes once more
    through its replacement, as :meth:`llmq_core.kafka.RenewableProducer.send_and_wait` does."""
    resent_broken = False
    while True:
        try:
            partitions = sorted(await asyncio.wait_for(producer.partitions_for(topic), metadata_timeout_ms / 1000))
        except TimeoutError:
            raise UnknownTopicOrPartitionError(f"no metadata for {topic!r}") from None
        partition = _PARTITIONER(key, partitions, partitions)
        try:
            ack = asyncio.ensure_future(
                await producer.send(topic, value, key=key, partition=partition, headers=headers)
            )
            if await _acked_unless_gone(producer, topic, partition, ack):
                return
        except kafka.BROKEN_PRODUCER_ERRORS:
            if resent_broken:
                raise
            resent_broken = True
        # else its partition is gone: the key maps elsewhere now


async def _acked_unless_gone(producer: AIOKafkaProducer, topic: str, partition: int, ack: asyncio.Future) -> bool:
    """Wait for ``ack`` (raising its error), unless a metadata update shows ``topic`` without ``partition`` first:
    False then (``ack`` is left to fail on its own; its error is retrieved)."""
    cluster = producer.client.cluster
    gone = asyncio.get_running_loop().create_future()

    def check(metadata) -> None:
        partitions = metadata.partitions_for_topic(topic)
        if partitions and partition not in partitions and not gone.done():  # missing for now (None): keep waiting
            gone.set_result(None)

    cluster.add_listener(check)
    try:
        await asyncio.wait({ack, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cluster.remove_listener(check)
        gone.cancel()
        if not ack.done():  # gone, or this wait cancelled (the router stops)
            ack.add_done_callback(_retrieve)
    if not ack.done():
        return False
    ack.result()
    return True


def _retrieve(ack: asyncio.Future) -> None:
    with contextlib.suppress(BaseException):
        ack.result()  # a held copy's NotLeaderForPartitionError: no "exception never retrieved" at collection

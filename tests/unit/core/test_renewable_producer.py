"""kafka.RenewableProducer with fake aiokafka producers: which failures replace the producer, and only once."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import (
    InvalidTopicError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    PolicyViolationError,
    ProducerClosed,
    ProducerFenced,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)

from llmq_core.clock import FakeClock
from llmq_core.kafka import RenewableProducer
from tests.unit.core.kafka_fakes import FakeKafkaProducer

RETRY_MS = 1000


def renewable(*made: FakeKafkaProducer) -> tuple[RenewableProducer, FakeClock, list[FakeKafkaProducer]]:
    """A RenewableProducer whose factory hands out ``made`` in order, then healthy fakes; returns what it made too."""
    pending, handed = list(made), []

    def factory() -> FakeKafkaProducer:
        handed.append(pending.pop(0) if pending else FakeKafkaProducer())
        return handed[-1]

    clock = FakeClock(0)
    return RenewableProducer(factory, clock=clock, renew_retry_ms=RETRY_MS), clock, handed


@pytest.mark.parametrize("error", [OutOfOrderSequenceNumber(), ProducerFenced()])
async def test_a_record_a_broken_producer_could_not_send_goes_once_more_through_its_replacement(error):
    producer, _, made = renewable(FakeKafkaProducer(ack_errors=[error]))
    await producer.start()
    await producer.send_and_wait("t", b"retried")  # the broker never wrote it: sending it again cannot double it
    assert [len(made), producer.renewals] == [2, 1]
    assert made[0].sent == [] and made[1].sent == [("t", b"retried")]
    await producer.stop()


@pytest.mark.parametrize(
    "error",
    [
        MessageSizeTooLargeError(),
        RecordListTooLargeError(),
        InvalidTopicError(),
        TopicAuthorizationFailedError(),
        PolicyViolationError(),
    ],
)
async def test_a_record_the_broker_refused_replaces_the_producer_before_the_next_send(error):
    producer, _, made = renewable(FakeKafkaProducer(ack_errors=[error]))
    await producer.start()
    with pytest.raises(type(error)):  # the caller still learns what happened to its record
        await producer.send_and_wait("t", b"refused")
    await producer.send_and_wait("t", b"next")
    assert [len(made), producer.renewals] == [2, 1]
    assert made[1].sent == [("t", b"next")] and made[1].started
    await producer.stop()
    assert made[0].stopped and made[1].stopped


@pytest.mark.parametrize("error", [KafkaTimeoutError(), ProducerClosed()])
async def test_a_transient_failure_keeps_the_producer(error):
    producer, _, made = renewable(FakeKafkaProducer(ack_errors=[error]))
    await producer.start()
    with pytest.raises(type(error)):
        await producer.send_and_wait("t", b"a")
    await producer.send_and_wait("t", b"b")
    assert (len(made), producer.renewals, made[0].sent) == (1, 0, [("t", b"b")])


async def test_a_record_refused_before_it_is_queued_keeps_the_producer():
    """The client's own max_request_size check raises from send(): no sequence number was taken."""
    producer, _, made = renewable(FakeKafkaProducer(send_errors=[MessageSizeTooLargeError()]))
    await producer.start()
    with pytest.raises(MessageSizeTooLargeError):
        await producer.send_and_wait("t", b"huge")
    await producer.send_and_wait("t", b"next")
    assert (len(made), made[0].sent) == (1, [("t", b"next")])


async def test_a_producer_whose_sender_died_is_replaced_when_a_send_finds_it():
    producer, _, made = renewable(FakeKafkaProducer(send_errors=[ProducerFenced()]))
    await producer.start()
    with pytest.raises(ProducerFenced):
        await producer.send("t", b"a")
    ack = await producer.send("t", b"b")  # send + ack, as the worker produces
    assert await ack == 0 and made[1].sent == [("t", b"b")]


async def test_many_sends_failing_on_one_broken_producer_replace_it_once():
    first = FakeKafkaProducer(ack_errors=[MessageSizeTooLargeError()])
    producer, _, made = renewable(first)
    await producer.start()
    acks = [await producer.send("t", b"big")]
    first.broken = False  # queued alongside, before the refusal was known: these fail out of order
    first.ack_errors = [OutOfOrderSequenceNumber()] * 3
    acks += [await producer.send("t", bytes([i])) for i in range(3)]
    outcomes = await asyncio.gather(*acks, return_exceptions=True)
    assert [type(o) for o in outcomes] == [MessageSizeTooLargeError, *[OutOfOrderSequenceNumber] * 3]
    assert (len(made), producer.renewals) == (2, 1)
    await asyncio.gather(*(producer.send_and_wait("t", bytes([i])) for i in range(3)))  # all on the fresh one
    assert len(made[1].sent) == 3


async def test_while_no_fresh_producer_starts_sends_fail_fast_and_a_start_is_tried_once_per_interval():
    broker_away = ConnectionError("broker away")
    producer, clock, made = renewable(
        FakeKafkaProducer(ack_errors=[InvalidTopicError()]),
        FakeKafkaProducer(start_error=broker_away),
        FakeKafkaProducer(start_error=broker_away),
    )
    await producer.start()
    with pytest.raises(InvalidTopicError):
        await producer.send_and_wait("t", b"a")
    assert (len(made), producer.renewals, made[1].stopped) == (2, 0, True)  # the fresh one did not start
    for _ in range(3):  # the broken one answers at once; no start is tried within the interval
        with pytest.raises(OutOfOrderSequenceNumber):
            await producer.send_and_wait("t", b"b")
    assert len(made) == 2
    clock.advance(RETRY_MS)
    with pytest.raises(OutOfOrderSequenceNumber):  # tried again: still away
        await producer.send_and_wait("t", b"c")
    clock.advance(RETRY_MS)
    await producer.send_and_wait("t", b"d")  # the broker is back
    assert (len(made), producer.renewals, made[3].sent) == (4, 1, [("t", b"d")])
    await producer.stop()
    assert made[0].stopped and made[3].stopped


async def test_a_failed_start_can_be_retried_and_sending_before_a_start_fails():
    producer, _, made = renewable(FakeKafkaProducer(start_error=ConnectionError("no broker")))
    with pytest.raises(ProducerClosed):
        await producer.send_and_wait("t", b"early")
    with pytest.raises(ConnectionError):
        await producer.start()
    await producer.start()
    assert await producer.partitions_for("t") == {0}
    await producer.send_and_wait("t", b"a")
    assert made[0].stopped and made[1].sent == [("t", b"a")]

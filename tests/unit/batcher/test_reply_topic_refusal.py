"""A Kafka-direct request whose reply topic may not receive results (Kafka's internal topics, llmq's own, outside the
configured prefixes) is answered ``errored`` at entry and never queued: its result used to be produced to
``__consumer_offsets`` or ``llmq.batches`` and retried there without end."""

from __future__ import annotations

import msgspec
import pytest

from llmq_core import ids, wire
from llmq_core.names import Names
from tests.fakes import Record
from tests.unit.batcher.helpers import INTERACTIVE, NAMES, req
from tests.unit.batcher.helpers import make_loop as make_batcher


def kafka_request(request_id: str, topic: str) -> wire.GenerationRequest:
    return msgspec.structs.replace(req(request_id), reply_to=wire.KafkaReply(topic=topic))


def make_loop(names: Names = NAMES):
    loop, consumer, producer, _ = make_batcher(names)
    return loop, loop.policy, producer, consumer


@pytest.mark.parametrize(
    "topic",
    [
        "__consumer_offsets",
        "__transaction_state",
        "llmq.batches",
        "llmq.results",
        "llmq.requests.interactive",
        "llmq.dead-letters",
        "bad topic",
    ],
)
async def test_a_refused_reply_topic_is_answered_errored_at_entry_and_never_queued(topic):
    loop, policy, producer, consumer = make_loop()
    await loop.ingest(INTERACTIVE, Record(offset=7, value=wire.encode(kafka_request("r1", topic)), key=b"r1"))
    (answer,) = producer.sent
    result = wire.decode(answer["value"])
    assert answer["topic"] == NAMES.results_topic and answer["key"] == ids.tenant_scoped_id("acme", "r1").encode()
    assert result.outcome is wire.Outcome.ERRORED and result.reply_to == wire.KafkaReply(topic=topic)
    assert (result.error.code, result.error.param, result.error.type) == (
        "invalid_reply_topic",
        "reply_to.topic",
        "invalid_request_error",
    )
    assert repr(topic) in result.error.message
    assert policy.queued_total == 0
    await loop.step(drain=True)
    assert consumer.commits == [{INTERACTIVE: 8}]
    assert [s["topic"] for s in producer.sent] == [NAMES.results_topic]  # nothing went to the refused topic


async def test_a_legal_reply_topic_is_queued():
    loop, policy, producer, _ = make_loop()
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(kafka_request("r1", "team.replies"))))
    assert policy.queued_total == 1 and producer.sent == []


async def test_configured_prefixes_refuse_every_other_topic():
    loop, policy, producer, _ = make_loop(Names(reply_topic_prefixes=("team.", "etl-")))
    for offset, topic in enumerate(["team.replies", "etl-out", "other.replies"]):
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(kafka_request(topic, topic))))
    assert policy.queued_total == 2
    assert [ids.producer_request_id(wire.decode(s["value"]).request_id) for s in producer.sent] == ["other.replies"]


async def test_a_refusal_that_cannot_be_produced_stays_unsettled_and_the_fetch_goes_on():
    loop, policy, producer, consumer = make_loop()
    producer.failing = True
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(kafka_request("bad", "llmq.batches"))))
    producer.failing = False
    await loop.ingest(INTERACTIVE, Record(offset=1, value=wire.encode(kafka_request("good", "team.replies"))))
    assert policy.queued_total == 1
    await loop.step(drain=True)
    assert consumer.commits == []  # offset 0 is not answered yet: a restart redelivers and refuses it again

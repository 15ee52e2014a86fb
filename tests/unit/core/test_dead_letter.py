"""kafka.dead_letter: the one way every loop dead-letters a record."""

from __future__ import annotations

from llmq_core import constants, kafka
from tests.fakes import FakeProducer, Record


async def test_the_record_goes_as_it_came_with_its_reason_cut_to_the_header_limit():
    producer = FakeProducer()
    record = Record(offset=3, value=b"v", key=b"k", headers=[("traceparent", b"00-x")])
    await kafka.dead_letter(producer, record, "é" * constants.HEADER_ERROR_MAX_BYTES, topic="private.dead-letters")
    (sent,) = producer.sent
    assert (sent["topic"], sent["value"], sent["key"]) == ("private.dead-letters", b"v", b"k")
    headers = dict(sent["headers"])
    assert headers["traceparent"] == b"00-x" and constants.HEADER_REPLY_TOPIC not in headers
    assert len(headers[constants.HEADER_ERROR]) == constants.HEADER_ERROR_MAX_BYTES


async def test_a_result_never_consumed_names_the_reply_topic_it_could_not_reach():
    producer = FakeProducer()
    letter = kafka.Letter(b"result", b"r1", kafka.headers())
    await kafka.dead_letter(producer, letter, "topic gone", reply_topic="team.replies")
    (sent,) = producer.on(constants.TOPIC_DEAD_LETTERS)
    headers = dict(sent["headers"])
    assert headers[constants.HEADER_ERROR] == b"topic gone" and headers[constants.HEADER_REPLY_TOPIC] == b"team.replies"
    assert headers[constants.HEADER_CONTENT_TYPE] == constants.CONTENT_TYPE_MSGPACK.encode()

"""The answer to a re-produced request_id (``FinalResult.request_copy``) reaches its copy's reply topic although the
request's own reply was delivered (it used to be suppressed as a redelivery: silence), once per copy, and never
replaces the stored result."""

from __future__ import annotations

import asyncio

import msgspec

from llmq_core import constants, wire
from tests.fake_results import result_record, succeeded
from tests.fakes import FakeConsumer, FakeRedis
from tests.unit.result_router.test_reply_retries import TP, Broker, _router


async def test_each_copy_gets_its_answer_once_and_the_first_result_stays_stored():
    first = succeeded("r1", "team.replies")
    copy = msgspec.structs.replace(first, reply_to=wire.KafkaReply(topic="team.other"), request_copy="t/0@9")
    records = [
        result_record(0, first),
        result_record(1, first),
        result_record(2, copy),
        result_record(3, copy),
    ]  # each one redelivered
    consumer, broker, redis = (
        FakeConsumer({TP: records}),
        Broker(existing={"team.replies", "team.other"}),
        FakeRedis(),
    )
    await asyncio.wait_for(_router(consumer, broker, redis).run(), 5)
    assert [(topic, key) for topic, key, _ in broker.sent] == [("team.replies", b"r1"), ("team.other", b"r1")]
    assert wire.decode(redis.data[constants.result_key("r1")]) == first

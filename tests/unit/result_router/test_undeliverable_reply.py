"""A Kafka reply to a topic name Kafka rejects is dead-lettered once, not retried forever ahead of every other result
(it used to hold up the whole llmq.results partition: aiokafka fails each send after its metadata timeout)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from llmq_core import constants, wire
from llmq_core.kafka import is_valid_topic_name
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from llmq_result_router.routing import plan_delivery
from tests.fake_results import result_record, succeeded
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis

TP = ("llmq.results", 0)


@pytest.mark.parametrize("name", ["", ".", "..", "bad topic", "a/b", "ü", "x" * 250, "t\n"])
def test_illegal_topic_names(name):
    assert not is_valid_topic_name(name)


@pytest.mark.parametrize("name", ["my.replies", "A-b_c.9", "x" * 249, "..."])
def test_legal_topic_names(name):
    assert is_valid_topic_name(name)


def test_an_illegal_reply_topic_is_planned_as_undeliverable_and_still_stored():
    delivery = plan_delivery(succeeded("r1", "bad topic/ with spaces!!"))
    assert delivery.undeliverable and not delivery.delivered_key  # never produced there; dead-lettered as the reply
    assert wire.decode(delivery.store).request_id == "r1"
    assert plan_delivery(succeeded("r2", "ok.replies")).undeliverable is None


async def route(*records) -> tuple[FakeConsumer, FakeProducer, FakeRedis]:
    """Run a router over ``records`` (one fetch) until it has routed them; the cluster has the topic ok.replies."""
    consumer, producer, redis = FakeConsumer({TP: list(records)}), FakeProducer({"ok.replies"}), FakeRedis()
    router = ResultRouter(Settings(), consumer, producer, redis, list_topics=producer.list_topics)
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    return consumer, producer, redis


async def test_the_router_dead_letters_an_illegal_reply_topic_and_delivers_the_nextsucceeded():
    consumer, producer, redis = await route(
        result_record(0, succeeded("bad", "")), result_record(1, succeeded("good", "ok.replies"))
    )
    assert producer.keys() == [(constants.TOPIC_DEAD_LETTERS, b"bad"), ("ok.replies", b"good")]
    assert constants.result_key("bad") in redis.data and consumer.commits == [None]


@pytest.mark.parametrize(
    "value", [None, b"\x91" * 100_000 + b"\x90", b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"]
)
async def test_a_poison_result_record_is_dead_lettered_and_the_next_one_delivered(value):
    poison = SimpleNamespace(topic=TP[0], partition=TP[1], offset=0, key=b"poison", value=value, headers=[])
    consumer, producer, redis = await route(poison, result_record(1, succeeded("good", "ok.replies")))
    assert producer.keys() == [(constants.TOPIC_DEAD_LETTERS, b"poison"), ("ok.replies", b"good")]


async def test_a_result_whose_routing_raises_is_dead_lettered_and_the_next_one_delivered(monkeypatch):
    """Any fault of one record (not Redis or Kafka being away) costs only that record: run() used to end on it, and
    the restarted router routed it again forever (QA finding 1's kind)."""
    from llmq_result_router import loop as router_loop

    plan = router_loop.plan_delivery

    def failing_plan(result, prefixes):
        if result.request_id == "odd":
            raise OverflowError("can't serialize")
        return plan(result, prefixes)

    monkeypatch.setattr(router_loop, "plan_delivery", failing_plan)
    consumer, producer, redis = await route(
        result_record(0, succeeded("odd", "ok.replies")), result_record(1, succeeded("good", "ok.replies"))
    )
    assert producer.keys() == [(constants.TOPIC_DEAD_LETTERS, b"odd"), ("ok.replies", b"good")]
    assert consumer.commits == [None]


@pytest.mark.parametrize("content_type", [constants.CONTENT_TYPE_JSON, constants.CONTENT_TYPE_MSGPACK])
async def test_a_dead_lettered_reply_keeps_the_producers_content_type(content_type):
    """The dead letter of a reply that could not be sent is that reply, in the format its producer asked for (a JSON
    producer's dead letters were the result records' msgpack)."""
    result = msgspec.structs.replace(
        succeeded("lost", "missing.replies"),
        reply_to=wire.KafkaReply(topic="missing.replies", content_type=content_type),
    )
    record = result_record(0, result)
    record.headers = [("traceparent", b"00-abc-def-01")]
    _, producer, _ = await route(record)
    (letter,) = producer.sent
    headers = dict(letter["headers"])
    assert letter["topic"] == constants.TOPIC_DEAD_LETTERS and letter["key"] == b"lost"
    assert headers["content-type"] == content_type.encode() and headers["traceparent"] == b"00-abc-def-01"
    assert wire.decode(letter["value"], content_type).request_id == "lost"
    assert headers["x-llmq-reply-topic"] == b"missing.replies" and b"does not exist" in headers["x-llmq-error"]

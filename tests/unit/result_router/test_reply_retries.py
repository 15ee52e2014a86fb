"""Kafka replies the broker will not take are tried a bounded number of times, then dead-lettered, and the results
behind them keep flowing (a missing or refused reply topic used to wedge its llmq.results partition for good)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka import errors

from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.kafka import reply_topic_error
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from llmq_result_router.replies import ReplyRetry, UnreachableTopics, give_up
from llmq_result_router.routing import plan_delivery
from tests.unit.result_router.fakes import FakeRedis

TP = ("llmq.results", 0)


# --- the rule: which topics may receive results ----------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state", "__anything", "llmq.batches",
                                   "llmq.results", "llmq.requests.interactive", "llmq.requests.deferred",
                                   "llmq.dead-letters", "llmq.other", "", "a b", "."])
def test_reserved_internal_and_illegal_topics_are_refused(topic):
    assert reply_topic_error(topic) is not None
    assert plan_delivery(_result("r", topic)).undeliverable == reply_topic_error(topic)


@pytest.mark.parametrize("topic", ["my.replies", "claims-etl.replies", "_single", "llmq", "llmqx.replies"])
def test_other_legal_topics_may_receive_results(topic):
    assert reply_topic_error(topic) is None


def test_prefixes_when_set_admit_only_topics_under_them():
    prefixes = ("team.", "etl-")
    assert reply_topic_error("team.replies", prefixes) is None and reply_topic_error("etl-x", prefixes) is None
    assert "allowed prefix" in reply_topic_error("other.replies", prefixes)
    assert "internal" in reply_topic_error("__consumer_offsets", ("__",))  # a prefix never admits a reserved topic


# --- the retry decision ----------------------------------------------------------------------------------------------


def test_transient_errors_back_off_exponentially_up_to_the_attempts():
    retry = ReplyRetry(attempts=4, backoff_ms=100)
    waits = [retry.wait_ms(errors.UnknownTopicOrPartitionError(), n) for n in range(1, 5)]
    assert waits == [100, 200, 400, None]
    assert retry.wait_ms(errors.KafkaTimeoutError(), 1) == 100
    assert retry.wait_ms(errors.KafkaConnectionError(), 3) == 400


@pytest.mark.parametrize("error", [errors.TopicAuthorizationFailedError(), errors.InvalidTopicError(),
                                   errors.MessageSizeTooLargeError(), errors.RecordTooLargeError()])
def test_permanent_errors_give_up_at_once(error):
    assert ReplyRetry(attempts=4, backoff_ms=100).wait_ms(error, 1) is None


def test_giving_up_says_why_and_whether_the_topic_itself_failed():
    missing = give_up("team.replies", errors.UnknownTopicOrPartitionError(), 4, 1750)
    assert missing.topic_wide and "'team.replies' does not exist" in missing.reason
    assert "4 tries in 1750 ms" in missing.reason
    too_large = give_up("team.replies", errors.MessageSizeTooLargeError(), 1, 3)
    assert not too_large.topic_wide and "MessageSizeTooLargeError" in too_large.reason


def test_an_unreachable_topic_is_remembered_for_its_ttl_only():
    clock = FakeClock()
    topics = UnreachableTopics(clock, ttl_ms=1000, max_topics=2)
    topics.mark("a", "gone")
    clock.advance(999)
    assert topics.reason("a").startswith("gone")
    clock.advance(1)
    assert topics.reason("a") is None
    for name in ("a", "b", "c"):
        topics.mark(name, "gone")
    assert topics.reason("a") is None and topics.reason("c") is not None  # the oldest is forgotten first


# --- the loop --------------------------------------------------------------------------------------------------------


def _result(request_id: str, topic: str) -> wire.FinalResult:
    return wire.FinalResult(request_id=request_id, outcome=wire.Outcome.SUCCEEDED, model="llmq-sim",
                            reply_to=wire.KafkaReply(topic=topic))


def _record(offset: int, result: wire.FinalResult, partition: int = 0):
    return SimpleNamespace(topic=TP[0], partition=partition, offset=offset, key=result.request_id.encode(),
                           value=wire.encode(result), headers=[])


class FakeConsumer:
    def __init__(self, batches) -> None:
        self.batches, self.commits, self.router = batches, 0, None

    async def getmany(self, timeout_ms, max_records):
        if not self.batches:
            self.router.stop()
            return {}
        return self.batches.pop(0)

    async def commit(self) -> None:
        self.commits += 1


class Broker:
    """A producer whose topics are ``existing``; ``too_large`` ones refuse every record; ``hang`` ones never show up in
    metadata (aiokafka would wait its whole request timeout)."""

    def __init__(self, existing=(), too_large=(), hang=()) -> None:
        self.existing, self.too_large, self.hang = set(existing), set(too_large), set(hang)
        self.sent: list[tuple[str, bytes, dict]] = []
        self.lookups: list[str] = []

    async def partitions_for(self, topic):
        self.lookups.append(topic)
        if topic in self.hang:
            await asyncio.Event().wait()
        if topic not in self.existing | self.too_large | {constants.TOPIC_DEAD_LETTERS}:
            raise errors.UnknownTopicOrPartitionError()
        return {0}

    async def send_and_wait(self, topic, value, key=None, headers=None):
        if topic in self.too_large:
            raise errors.MessageSizeTooLargeError()
        self.sent.append((topic, key, dict(headers or ())))



def _router(consumer, broker, redis, **settings) -> ResultRouter:
    base = dict(router_reply_attempts=3, router_reply_backoff_ms=1, router_reply_metadata_timeout_ms=20)
    router = consumer.router = ResultRouter(Settings(**{**base, **settings}), consumer, broker, redis,
                                            clock=FakeClock())
    return router


async def test_a_missing_reply_topic_is_dead_lettered_after_its_tries_and_the_next_results_flow():
    batch = {TP: [_record(0, _result("lost", "gone.replies")), _record(1, _result("ok", "team.replies")),
                  _record(2, _result("lost-2", "gone.replies"))]}
    consumer, broker, redis = FakeConsumer([batch]), Broker(existing={"team.replies"}), FakeRedis()
    await asyncio.wait_for(_router(consumer, broker, redis).run(), 5)
    assert [(topic, key) for topic, key, _ in broker.sent] == [
        (constants.TOPIC_DEAD_LETTERS, b"lost"), ("team.replies", b"ok"), (constants.TOPIC_DEAD_LETTERS, b"lost-2")]
    headers = broker.sent[0][2]
    assert headers[constants.HEADER_REPLY_TOPIC] == b"gone.replies"
    assert b"does not exist" in headers[constants.HEADER_ERROR]
    assert broker.lookups.count("gone.replies") == 3  # its tries; the second result skips them (topic remembered)
    assert b"not retried" in broker.sent[2][2][constants.HEADER_ERROR]
    assert consumer.commits == 1
    for request_id in ("lost", "ok", "lost-2"):  # stored for GET /v1/requests/{id}; a redelivery does not try again
        assert constants.result_key(request_id) in redis.data and constants.delivered_key(request_id) in redis.data


async def test_a_record_too_large_is_dead_lettered_after_one_try():
    consumer = FakeConsumer([{TP: [_record(0, _result("big", "team.replies"))]}])
    broker = Broker(too_large={"team.replies"})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    [(topic, _, headers)] = broker.sent
    assert topic == constants.TOPIC_DEAD_LETTERS and b"MessageSizeTooLargeError" in headers[constants.HEADER_ERROR]
    assert broker.lookups == ["team.replies"]


async def test_a_topic_stuck_in_metadata_holds_up_only_its_own_partition_and_only_for_its_tries():
    stuck, other = {TP: [_record(0, _result("stuck", "slow.replies"))]}, {("llmq.results", 1): [
        _record(0, _result("ok", "team.replies"), partition=1)]}
    consumer = FakeConsumer([{**stuck, **other}])
    broker = Broker(existing={"team.replies"}, hang={"slow.replies"})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    assert [(topic, key) for topic, key, _ in broker.sent] == [
        ("team.replies", b"ok"), (constants.TOPIC_DEAD_LETTERS, b"stuck")]  # the other partition went first
    assert broker.lookups.count("slow.replies") == 3


@pytest.mark.parametrize("topic", ["__consumer_offsets", "llmq.batches", "llmq.results", "llmq.requests.deferred"])
async def test_a_reserved_reply_topic_is_never_produced_to(topic):
    consumer = FakeConsumer([{TP: [_record(0, _result("r", topic)), _record(1, _result("ok", "team.replies"))]}])
    broker = Broker(existing={"team.replies", topic})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    assert [(t, key) for t, key, _ in broker.sent] == [(constants.TOPIC_DEAD_LETTERS, b"r"), ("team.replies", b"ok")]
    assert broker.sent[0][2][constants.HEADER_REPLY_TOPIC] == topic.encode()

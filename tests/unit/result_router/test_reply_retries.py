"""Kafka replies the broker will not take are tried a bounded number of times, then dead-lettered, and the results
behind them keep flowing (a missing or refused reply topic used to wedge its llmq.results partition for good)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import errors

from llmq_core import constants
from llmq_core.clock import FakeClock
from llmq_core.kafka import reply_topic_error
from llmq_core.metrics import RouterMetrics
from llmq_core.settings import Settings
from llmq_core.topics import Presence, TopicView
from llmq_result_router.loop import ResultRouter
from llmq_result_router.replies import LogGate, ReplyRetry, give_up
from llmq_result_router.routing import plan_delivery
from tests.fake_results import result_record, succeeded
from tests.fakes import FakeClient, FakeCluster, FakeConsumer, FakeRedis

TP = ("llmq.results", 0)


# --- the rule: which topics may receive results ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "__consumer_offsets",
        "__transaction_state",
        "__anything",
        "llmq.batches",
        "llmq.results",
        "llmq.requests.interactive",
        "llmq.requests.deferred",
        "llmq.dead-letters",
        "llmq.other",
        "",
        "a b",
        ".",
    ],
)
def test_reserved_internal_and_illegal_topics_are_refused(topic):
    assert reply_topic_error(topic) is not None
    assert plan_delivery(succeeded("r", topic)).undeliverable == reply_topic_error(topic)


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
    retry = ReplyRetry(attempts=4, backoff_ms=100, budget_ms=10_000, max_streak=3)
    waits = [retry.wait_ms(errors.UnknownTopicOrPartitionError(), n, 0, 0) for n in range(1, 5)]
    assert waits == [100, 200, 400, None]
    assert retry.wait_ms(errors.KafkaTimeoutError(), 1, 0, 0) == 100
    assert retry.wait_ms(errors.KafkaConnectionError(), 3, 0, 0) == 400


def test_retries_end_within_the_budget_of_onesucceeded():
    retry = ReplyRetry(attempts=10, backoff_ms=100, budget_ms=2000, max_streak=3)
    assert retry.wait_ms(errors.KafkaTimeoutError(), 2, 1799, 0) == 200
    assert retry.wait_ms(errors.KafkaTimeoutError(), 2, 1800, 0) is None  # the wait would end past the budget
    assert retry.try_timeout_ms(1500, metadata_timeout_ms=1000) == 500  # a try gets what is left, at most its own
    assert retry.try_timeout_ms(0, metadata_timeout_ms=1000) == 1000


def test_a_partition_retries_no_more_once_results_in_a_row_ended_unsent():
    retry = ReplyRetry(attempts=4, backoff_ms=100, budget_ms=2000, max_streak=3)
    assert retry.wait_ms(errors.KafkaTimeoutError(), 1, 0, streak=2) == 100
    assert retry.wait_ms(errors.KafkaTimeoutError(), 1, 0, streak=3) is None


@pytest.mark.parametrize(
    "error",
    [
        errors.TopicAuthorizationFailedError(),
        errors.InvalidTopicError(),
        errors.MessageSizeTooLargeError(),
        errors.RecordTooLargeError(),
    ],
)
def test_permanent_errors_give_up_at_once(error):
    assert ReplyRetry(attempts=4, backoff_ms=100, budget_ms=2000, max_streak=3).wait_ms(error, 1, 0, 0) is None


def test_giving_up_says_why_and_whether_the_topic_itself_failed():
    missing = give_up("team.replies", errors.UnknownTopicOrPartitionError(), 4, 1750)
    assert missing.topic_wide and missing.kind == "retries" and "'team.replies' does not exist" in missing.reason
    assert "4 tries in 1750 ms" in missing.reason
    too_large = give_up("team.replies", errors.MessageSizeTooLargeError(), 1, 3)
    assert not too_large.topic_wide and too_large.kind == "refused"
    assert "MessageSizeTooLargeError" in too_large.reason


def test_a_reply_the_acls_refuse_says_authorization_failed_not_does_not_exist():
    """Issue 34, item 5: on a secure stack without the router's reply-topic ACLs every answer was dead-lettered as
    "does not exist": the broker lists only the topics a principal may see, and refuses a write it may not make."""
    refused = give_up("replies.acme", errors.TopicAuthorizationFailedError(), 1, 3)
    assert "authorization failed" in refused.reason and "does not exist" not in refused.reason
    clock = FakeClock()
    secure = TopicView(clock, refresh_ms=1000, secure=True)
    secure.update(set(), listed_ms=clock.now_ms())
    assert "authorization failed" in secure.missing("replies.acme").reason
    assert "authorization" not in TopicView(clock, refresh_ms=1000).missing("replies.acme").reason  # plaintext


# --- which topics exist ----------------------------------------------------------------------------------------------


def test_a_topic_missing_from_a_listing_newer_than_the_result_is_missing_whatever_its_name():
    clock = FakeClock()
    view = TopicView(clock, refresh_ms=1000)
    received_ms = clock.now_ms()
    assert view.presence("team.replies", received_ms) is Presence.UNKNOWN and view.wait_ms() == 0
    view.update({"team.replies"}, listed_ms=received_ms)
    assert view.presence("team.replies", received_ms) is Presence.EXISTS
    for i in range(1000):  # invented names cost no further listing
        assert view.presence(f"fresh.{i}", received_ms) is Presence.MISSING
    missing = view.missing("fresh.1")
    assert missing.kind == "missing_topic" and "'fresh.1' does not exist" in missing.reason


def test_a_listing_older_than_the_result_is_asked_again_at_most_once_per_refresh_interval():
    clock = FakeClock()
    view = TopicView(clock, refresh_ms=1000)
    view.update({"team.replies"}, listed_ms=clock.now_ms())
    clock.advance(300)
    assert view.presence("new.replies", clock.now_ms()) is Presence.UNKNOWN  # may have been created since
    assert view.presence("team.replies", clock.now_ms()) is Presence.EXISTS  # no listing needed
    assert view.wait_ms() == 700
    clock.advance(700)
    assert view.wait_ms() == 0


def test_a_topic_that_failed_as_a_whole_is_missing_until_a_listing_shows_it_again():
    clock = FakeClock()
    view = TopicView(clock, refresh_ms=1000)
    view.update({"team.replies"}, listed_ms=clock.now_ms())
    view.forget("team.replies")
    assert view.presence("team.replies", clock.now_ms()) is Presence.MISSING
    clock.advance(1)
    assert view.presence("team.replies", clock.now_ms()) is Presence.UNKNOWN


def test_reply_failures_log_one_line_per_topic_per_window_and_a_bounded_number_in_all():
    clock = FakeClock()
    gate = LogGate(clock, window_ms=1000, max_lines=3)
    assert [gate.allow(t) for t in ("a", "a", "b", "c", "d")] == [True, False, True, True, False]
    clock.advance(1000)
    assert gate.allow("a") and gate.allow("d")


# --- the loop --------------------------------------------------------------------------------------------------------


class Broker:
    """A producer whose topics are ``existing``; ``too_large`` ones refuse every record; ``hang`` ones never show up in
    metadata (aiokafka would wait its whole request timeout); ``flaky`` ones time out every send. All of them are
    listed as the cluster's topics."""

    def __init__(self, existing=(), too_large=(), hang=(), flaky=()) -> None:
        self.existing, self.too_large, self.hang, self.flaky = set(existing), set(too_large), set(hang), set(flaky)
        self.sent: list[tuple[str, bytes, dict]] = []
        self.lookups: list[str] = []
        self.listings = 0
        self.client = FakeClient(FakeCluster())

    def topics(self) -> set[str]:
        return self.existing | self.too_large | self.hang | self.flaky | {constants.TOPIC_DEAD_LETTERS}

    async def list_topics(self):
        self.listings += 1
        return self.topics()

    async def partitions_for(self, topic):
        self.lookups.append(topic)
        if topic in self.hang:
            await asyncio.Event().wait()
        if topic not in self.topics():
            raise errors.UnknownTopicOrPartitionError()
        return {0}

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        if topic in self.too_large:
            raise errors.MessageSizeTooLargeError()
        if topic in self.flaky:
            raise errors.KafkaTimeoutError()
        self.sent.append((topic, key, dict(headers or ())))

    async def send(self, topic, value, key=None, partition=None, headers=None):
        """aiokafka's two-step send: queued at once, the ack then raises what the broker answered."""
        return self.send_and_wait(topic, value, key=key, partition=partition, headers=headers)


def _router(consumer, broker, redis, metrics=None, **router) -> ResultRouter:
    base = dict(reply_attempts=3, reply_backoff_ms=1, reply_metadata_timeout_ms=20)
    router = ResultRouter(
        Settings(router={**base, **router}),
        consumer,
        broker,
        redis,
        metrics=metrics,
        clock=FakeClock(),
        list_topics=broker.list_topics,
    )
    consumer.drained = router.stop
    return router


async def test_replies_to_missing_topics_are_dead_lettered_at_once_whatever_their_names_and_the_next_results_flow():
    fresh = [result_record(i, succeeded(f"lost-{i}", f"gone.{i}.replies")) for i in range(16)]
    batch = {
        TP: [
            *fresh,
            result_record(16, succeeded("ok", "team.replies")),
            result_record(17, succeeded("again", "gone.0.replies")),
        ]
    }
    consumer, broker, redis, metrics = (
        FakeConsumer(batch),
        Broker(existing={"team.replies"}),
        FakeRedis(),
        RouterMetrics(),
    )
    await asyncio.wait_for(_router(consumer, broker, redis, metrics).run(), 5)
    assert [(topic, key) for topic, key, _ in broker.sent] == [
        *[(constants.TOPIC_DEAD_LETTERS, f"lost-{i}".encode()) for i in range(16)],
        ("team.replies", b"ok"),
        (constants.TOPIC_DEAD_LETTERS, b"again"),
    ]
    headers = broker.sent[0][2]
    assert headers[constants.HEADER_REPLY_TOPIC] == b"gone.0.replies"
    assert b"does not exist" in headers[constants.HEADER_ERROR]
    assert broker.listings == 1 and broker.lookups == ["team.replies"]  # one listing; no try for a missing topic
    assert metrics.reply_dead_letters.labels("missing_topic")._value.get() == 17
    assert metrics.log_lines_suppressed._value.get() == 1  # gone.0.replies again, within the window
    assert consumer.commits == [None]
    for request_id in ("lost-0", "ok", "again"):  # stored for GET /v1/requests/{id}; a redelivery does not try again
        assert constants.result_key(request_id) in redis.data and constants.delivered_key(request_id) in redis.data


async def test_a_record_too_large_is_dead_lettered_after_one_try():
    consumer = FakeConsumer({TP: [result_record(0, succeeded("big", "team.replies"))]})
    broker = Broker(too_large={"team.replies"})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    [(topic, _, headers)] = broker.sent
    assert topic == constants.TOPIC_DEAD_LETTERS and b"MessageSizeTooLargeError" in headers[constants.HEADER_ERROR]
    assert broker.lookups == ["team.replies"]


async def test_a_topic_stuck_in_metadata_holds_up_only_its_own_partition_and_only_for_its_tries():
    stuck, other = (
        {TP: [result_record(0, succeeded("stuck", "slow.replies"))]},
        {("llmq.results", 1): [result_record(0, succeeded("ok", "team.replies"), partition=1)]},
    )
    consumer = FakeConsumer({**stuck, **other})
    broker = Broker(existing={"team.replies"}, hang={"slow.replies"})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    assert [(topic, key) for topic, key, _ in broker.sent] == [
        ("team.replies", b"ok"),
        (constants.TOPIC_DEAD_LETTERS, b"stuck"),
    ]  # the other partition went first
    assert broker.lookups.count("slow.replies") == 3


async def test_a_partition_stops_retrying_once_results_in_a_row_ended_unsent_until_a_reply_goes_out():
    flaky = [result_record(i, succeeded(f"f{i}", "flaky.replies")) for i in range(4)]
    consumer = FakeConsumer(
        {
            TP: [
                *flaky,
                result_record(4, succeeded("ok", "team.replies")),
                result_record(5, succeeded("f5", "flaky.replies")),
            ]
        }
    )
    broker, metrics = Broker(existing={"team.replies"}, flaky={"flaky.replies"}), RouterMetrics()
    await asyncio.wait_for(_router(consumer, broker, FakeRedis(), metrics, reply_retry_streak_max=2).run(), 5)
    assert broker.lookups.count("flaky.replies") == 3 + 3 + 1 + 1 + 3  # 2 in a row with retries, then one try each
    assert metrics.reply_dead_letters.labels("retries")._value.get() == 5


@pytest.mark.parametrize("topic", ["__consumer_offsets", "llmq.batches", "llmq.results", "llmq.requests.deferred"])
async def test_a_reserved_reply_topic_is_never_produced_to(topic):
    consumer = FakeConsumer(
        {TP: [result_record(0, succeeded("r", topic)), result_record(1, succeeded("ok", "team.replies"))]}
    )
    broker = Broker(existing={"team.replies", topic})
    await asyncio.wait_for(_router(consumer, broker, FakeRedis()).run(), 5)
    assert [(t, key) for t, key, _ in broker.sent] == [(constants.TOPIC_DEAD_LETTERS, b"r"), ("team.replies", b"ok")]
    assert broker.sent[0][2][constants.HEADER_REPLY_TOPIC] == topic.encode()

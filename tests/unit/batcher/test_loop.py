"""The batcher loop's consume -> decide -> produce -> commit round, with fake Kafka and Redis clients."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)

from llmq_batcher.dispatch import is_permanent, retry_delay_ms
from llmq_core import constants, wire
from llmq_core.metrics import BatcherMetrics
from llmq_core.status import ErrorCode
from tests.fakes import FakeConsumer, Record
from tests.unit.batcher.helpers import DEFERRED, INTERACTIVE, MODEL, NAMES, T0, hb, make_loop, req


def _json(request: wire.GenerationRequest, header: bool) -> Record:
    headers = ((constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_JSON.encode()),) if header else ()
    return Record(offset=0, value=wire.encode(request, constants.CONTENT_TYPE_JSON), headers=headers)


@pytest.mark.parametrize("header", [True, False])
async def test_json_request_is_batched_to_the_workers_partition_and_committed(batcher, header):
    loop, consumer, producer, _ = batcher
    loop.policy.on_heartbeat(hb("w5", free=8), loop.clock.now_ms())
    record = _json(req("r1"), header)
    record.offset = 41
    await loop.ingest(INTERACTIVE, record)
    await loop.step()
    (sent,) = producer.on(NAMES.batches_topic)
    batch = wire.decode(sent["value"])
    assert sent["partition"] == 5 and sent["key"] == batch.batch_id.encode()
    assert [r.request_id for r in batch.requests] == ["r1"]
    assert consumer.commits == [{INTERACTIVE: 42}]


async def test_commit_waits_for_the_oldest_held_request(batcher):
    loop, consumer, _, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=1), loop.clock.now_ms())
    for offset, request in ((10, req("n1", "near")), (11, req("p1"))):  # one slot: p1 goes first, n1 waits
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(request)))
    await loop.step()
    assert consumer.commits == []
    loop.policy.on_heartbeat(hb("w1", free=1, last_batch_id="t-1"), loop.clock.now_ms())
    await loop.step(drain=True)
    assert consumer.commits == [{INTERACTIVE: 12}]


async def test_duplicate_of_a_dispatched_request_is_settled_at_once(batcher):
    loop, consumer, _, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(req("r1"))))
    await loop.step()
    await loop.ingest(INTERACTIVE, Record(offset=1, value=wire.encode(req("r1"))))
    await loop.step(drain=True)
    assert consumer.commits[-1] == {INTERACTIVE: 2}


@pytest.mark.parametrize("value", [b"\xc1garbage", wire.encode(wire.Cancel(request_id="r1"))])
async def test_undecodable_or_foreign_record_goes_to_dead_letters(batcher, value):
    loop, consumer, producer, _ = batcher
    await loop.ingest(INTERACTIVE, Record(offset=7, value=value, key=b"k"))
    await loop.step(drain=True)
    (dead,) = producer.on(NAMES.dead_letters_topic)
    assert dead["value"] == value and dead["key"] == b"k"
    assert any(name == "x-llmq-error" for name, _ in dead["headers"])
    assert consumer.commits == [{INTERACTIVE: 8}]


async def test_expired_request_is_answered_to_its_pod_and_the_results_log(batcher):
    loop, consumer, producer, redis = batcher
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(req("r1", deadline_in_ms=0))))
    await loop.step()
    ((channel, payload),) = redis.published
    assert channel == constants.replies_channel("pod-1")
    assert wire.decode(payload).outcome is wire.Outcome.EXPIRED
    (logged,) = producer.on(NAMES.results_topic)
    assert logged["key"] == b"r1" and wire.decode(logged["value"]).outcome is wire.Outcome.EXPIRED
    assert redis.hashes[NAMES.stats_key][b"expired"] == 1
    assert consumer.commits == [{INTERACTIVE: 1}]


async def test_failed_produce_hands_the_batch_back_and_commits_nothing(batcher):
    loop, consumer, producer, redis = batcher
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(req("r1"))))
    producer.failing = True
    await loop.step(drain=True)
    assert consumer.commits == [] and loop.policy.queued_total == 1
    producer.failing = False
    await loop.step(drain=True)
    assert [wire.decode(s["value"]).requests[0].attempt for s in producer.on(NAMES.batches_topic)] == [1]
    assert consumer.commits == [{INTERACTIVE: 1}]
    assert redis.hashes[NAMES.stats_key][b"batches"] == 1


async def test_a_request_of_a_lost_worker_goes_out_again_continuing_from_its_progress():
    loop, _, producer, redis = make_loop(metrics=BatcherMetrics(), policy_config={"worker_heartbeat_timeout_ms": 2000})
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    for offset, request_id in enumerate(["r1", "r2"]):
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(req(request_id, max_tokens=50))))
    await loop.step()
    frames = [
        wire.Progress(attempt=0, index=0, start=0, token_ids=[5, 6]),
        wire.Progress(attempt=0, index=0, start=2, token_ids=[7]),
    ]
    await redis.rpush(constants.progress_key("r1"), *(wire.encode(f) for f in frames), b"not a frame")
    loop.clock.advance(2001)  # w1 went silent: its two requests go to w2 as attempt 1
    loop.policy.on_heartbeat(hb("w2", free=8, now_ms=loop.clock.now_ms()), loop.clock.now_ms())
    await loop.step(drain=True)
    _, again = [wire.decode(s["value"]) for s in producer.on(NAMES.batches_topic)]
    assert {r.request_id: (r.attempt, r.continuation) for r in again.requests} == {
        "r1": (1, wire.Continuation(token_ids=[[5, 6, 7]], hops=1, from_attempt=0)),
        "r2": (1, None),  # nothing generated (or none written): from its start
    }
    registry = loop.metrics.registry
    assert registry.get_sample_value("llmq_batcher_redispatches_total", {"model": MODEL, "outcome": "continued"}) == 1
    assert registry.get_sample_value("llmq_batcher_redispatches_total", {"model": MODEL, "outcome": "from_start"}) == 1
    assert registry.get_sample_value("llmq_batcher_continued_tokens_total", {"model": MODEL}) == 3


async def test_batch_stats_count_batches_requests_and_flush_reasons(batcher):
    loop, _, _, redis = batcher
    loop.policy.on_heartbeat(hb("w1", free=2), loop.clock.now_ms())
    for offset in range(3):
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(req(f"r{offset}"))))
    await loop.step()
    stats = redis.hashes[NAMES.stats_key]
    assert (stats[b"batches"], stats[b"requests"], stats[b"flush_size"]) == (1, 2, 1)
    assert stats[b"queued_interactive:paid"] == 1
    (saturation,) = redis.hashes[NAMES.saturation_key].values()
    report = wire.decode(saturation)
    assert report.classes["interactive:paid"].depth == 1 and report.started_ms == loop.report.started_ms
    assert (report.models["llmq-sim"].classes["interactive:paid"].depth, report.models["llmq-sim"].workers) == (1, 1)


async def test_stats_of_rounds_within_the_interval_are_written_together_and_all_at_drain(batcher):
    loop, _, _, redis = batcher
    for offset in range(
        3
    ):  # round 1 writes (the first), rounds 2 and 3 fall within constants.SATURATION_REPORT_INTERVAL_MS of it
        loop.policy.on_heartbeat(hb("w1", free=1, last_batch_id=f"t-{offset}"), loop.clock.now_ms())
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(req(f"r{offset}"))))
        await loop.step()
        loop.clock.advance(10)
    assert redis.hashes[NAMES.stats_key][b"batches"] == 1
    loop.clock.advance(constants.SATURATION_REPORT_INTERVAL_MS)
    await loop.step()
    assert redis.hashes[NAMES.stats_key][b"batches"] == 3
    loop.policy.on_heartbeat(hb("w1", free=1, last_batch_id="t-3"), loop.clock.now_ms())
    await loop.ingest(INTERACTIVE, Record(offset=3, value=wire.encode(req("r3"))))
    await loop.step(drain=True)
    assert redis.hashes[NAMES.stats_key][b"batches"] == 4


@pytest.mark.parametrize(
    "free, queued, paused",
    [
        (8, [], False),  # idle capacity, nothing else waiting
        (2, [], False),  # only the reserved slots are free: deferred work is read ahead anyway
        (0, [("p1", "paid")], False),  # interactive work waits: deferred work is read to ride along
        (0, [(f"d{i}", "deferred") for i in range(12)], True),  # its buffer is full: 2 x (8 slots - 2 reserved)
    ],
)
async def test_deferred_partitions_pause_only_while_their_buffer_is_full(batcher, free, queued, paused):
    loop, consumer, _, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=free), loop.clock.now_ms())
    for request_id, cls in queued:
        loop.policy.add(req(request_id, cls), loop.clock.now_ms())
    await loop.step()
    assert (DEFERRED in consumer.paused_tps) is paused
    assert INTERACTIVE not in consumer.paused_tps


async def test_deferred_partitions_resume_once_the_buffer_drains(batcher):
    loop, consumer, _, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=0), loop.clock.now_ms())
    for i in range(12):
        loop.policy.add(req(f"d{i}", "deferred"), loop.clock.now_ms())
    await loop.step()
    assert DEFERRED in consumer.paused_tps
    loop.policy.on_heartbeat(hb("w1", free=8, now_ms=T0), loop.clock.now_ms())
    loop.clock.advance(500)  # past the deferred window: 6 go out
    await loop.step()
    assert DEFERRED not in consumer.paused_tps


# --- produce failures: never re-queued at the head for good, never a busy loop --------------------------------------


@pytest.mark.parametrize(
    "exc, permanent",
    [
        (MessageSizeTooLargeError(), True),  # the broker's or the producer's record limit
        (RecordTooLargeError(), True),
        (InvalidTopicError(), True),
        (TopicAuthorizationFailedError(), True),
        (KafkaTimeoutError(), False),  # broker down: metadata or the send timed out
        (KafkaConnectionError(), False),
        (ProducerClosed(), False),
        (OutOfOrderSequenceNumber(), False),  # follows a refused record: retried on a fresh producer
        (ProducerFenced(), False),
        (RuntimeError("anything else"), False),
    ],
)
def test_permanent_produce_errors_are_those_no_retry_can_fix(exc, permanent):
    assert is_permanent(exc) is permanent


@pytest.mark.parametrize("failures, delay_ms", [(1, 100), (2, 200), (3, 400), (6, 3200), (7, 5000), (1000, 5000)])
def test_retry_delay_doubles_per_failure_in_a_row_up_to_a_cap(failures, delay_ms):
    assert retry_delay_ms(failures) == delay_ms


async def test_transient_failure_holds_the_model_with_growing_backoff(batcher):
    loop, consumer, producer, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(req("r1"))))
    producer.failing = True
    assert (await loop.step()).batches  # formed, refused
    held = await loop.step()
    assert held.batches == [] and held.next_wake_ms == T0 + 100  # no second try before the hold ends
    loop.clock.advance(100)
    assert (await loop.step()).batches  # refused again
    assert (await loop.step()).next_wake_ms == T0 + 100 + 200  # second failure in a row: twice the hold
    producer.failing = False
    loop.clock.advance(200)
    await loop.step(drain=True)
    assert [wire.decode(s["value"]).requests[0].attempt for s in producer.on(NAMES.batches_topic)] == [2]
    assert consumer.commits == [{INTERACTIVE: 1}]


def _too_large(result: wire.FinalResult) -> bool:
    return (
        result.outcome is wire.Outcome.ERRORED
        and result.error.code == ErrorCode.REQUEST_TOO_LARGE
        and not result.error.retryable
    )


async def test_batch_refused_as_too_large_is_bisected_and_a_lone_misfit_answered(batcher):
    loop, consumer, producer, redis = batcher
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    sizes = [1000, 1000, 5000, 1000, 1000]  # the broker takes records up to ~2,400 bytes: r2 never fits
    for i, chars in enumerate(sizes):
        await loop.ingest(INTERACTIVE, Record(offset=i, value=wire.encode(req(f"r{i}", prompt="x" * chars))))
    producer.max_value_bytes = 2400
    await loop.step()
    await loop.step(drain=True)  # the answer to r2 goes out in the next round (drain: commit now)
    batches = [wire.decode(s["value"]) for s in producer.on(NAMES.batches_topic)]
    assert sorted(r.request_id for b in batches for r in b.requests) == ["r0", "r1", "r3", "r4"]
    assert all(b.worker_id == "w1" and len({b.batch_id for b in batches}) == len(batches) for b in batches)
    (answer,) = [wire.decode(s["value"]) for s in producer.on(NAMES.results_topic)]
    assert answer.request_id == "r2" and _too_large(answer)
    assert [wire.decode(payload).request_id for _, payload in redis.published] == ["r2"]
    assert loop.policy.queued_total == 0 and loop.policy.inflight_total == 4
    assert consumer.commits[-1] == {INTERACTIVE: 5}


async def test_request_too_large_for_any_batch_is_answered_on_arrival():
    loop, consumer, producer, _ = make_loop(policy_config={"max_batch_bytes": 2000})
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    await loop.ingest(INTERACTIVE, Record(offset=0, value=wire.encode(req("big", prompt="x" * 3000))))
    await loop.ingest(INTERACTIVE, Record(offset=1, value=wire.encode(req("small"))))
    await loop.step()
    (batch,) = [wire.decode(s["value"]) for s in producer.on(NAMES.batches_topic)]
    assert [r.request_id for r in batch.requests] == ["small"]
    (answer,) = [wire.decode(s["value"]) for s in producer.on(NAMES.results_topic)]
    assert answer.request_id == "big" and _too_large(answer) and answer.error.type == "invalid_request_error"
    assert consumer.commits == [{INTERACTIVE: 2}]


async def test_batch_refused_for_good_for_another_reason_is_answered_errored(batcher):
    loop, consumer, producer, _ = batcher
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    for i in range(3):
        await loop.ingest(INTERACTIVE, Record(offset=i, value=wire.encode(req(f"r{i}"))))
    producer.failing = InvalidTopicError()
    await loop.step()
    producer.failing = False
    await loop.step()
    answers = [wire.decode(s["value"]) for s in producer.on(NAMES.results_topic)]
    assert sorted(a.request_id for a in answers) == ["r0", "r1", "r2"]
    assert {(a.outcome, a.error.type, a.error.code, a.error.retryable) for a in answers} == {
        (wire.Outcome.ERRORED, "server_error", "dispatch_failed", False)
    }
    assert producer.on(NAMES.batches_topic) == [] and loop.policy.queued_total == 0
    assert consumer.commits[-1] == {INTERACTIVE: 3}


class _QuietPubSub:
    """A Redis subscription on which nothing arrives."""

    async def subscribe(self, *channels: str) -> None:
        pass

    async def get_message(self, ignore_subscribe_messages: bool, timeout: float) -> None:
        await asyncio.sleep(timeout)

    async def aclose(self) -> None:
        pass


async def test_run_takes_records_in_and_at_stop_dispatches_commits_and_reports():
    fetched = {INTERACTIVE: [Record(offset=3, value=wire.encode(req("r1")))]}
    loop, consumer, producer, redis = make_loop(consumer=FakeConsumer(fetched, assigned={INTERACTIVE}))
    consumer.drained = loop.stop  # the fetch after the record's
    redis.pubsub = _QuietPubSub
    loop.policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    await asyncio.wait_for(loop.run(), 10)
    assert [r.request_id for r in wire.decode(producer.on(NAMES.batches_topic)[0]["value"]).requests] == ["r1"]
    assert consumer.commits[-1] == {INTERACTIVE: 4}
    assert wire.decode(redis.hashes[NAMES.saturation_key][b"t"]).models["llmq-sim"].workers == 1

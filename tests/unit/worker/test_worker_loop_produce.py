"""WorkerLoop._deliver's produce path with fakes: results reach llmq.results before any Redis answer; a record refused
for good is replaced by its errored stand-in in both places; transient errors are retried a bounded number of times."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, TopicAuthorizationFailedError

from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_worker import publisher
from llmq_worker.core import WorkerCore
from llmq_worker.loop import WorkerLoop
from llmq_worker.publisher import PRODUCE_ATTEMPTS
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis
from tests.unit.worker.worker_fakes import T0_MS, StepEngine, batch, make_request

BATCHES = TopicPartition(constants.TOPIC_BATCHES, 0)


def setup(failures: dict[str, list[Exception]]):
    clock = FakeClock(T0_MS + 100)
    engine = StepEngine(clock)
    core = WorkerCore(worker_id="w1", partition=0, model="llmq-sim", engine=engine, clock=clock)
    events: list = []
    producer = FakeProducer(log=events)
    producer.failures = failures
    producer.refusing_topics = {constants.TOPIC_DEAD_LETTERS}  # e.g. a record at the topic limit, plus the reason
    loop = WorkerLoop(
        core=core,
        engine=engine,
        consumer=FakeConsumer(),
        producer=producer,
        redis=FakeRedis(log=events),
        clock=clock,
        heartbeat_interval_ms=100,
        shutdown_grace_s=1,
        max_pending=8,
    )
    core.take_batch(batch(make_request("a", "hi", stream=False), make_request("b", "yo", stream=False)), offset=3)
    return loop, core.on_events(engine.step()), events


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(publisher, "PRODUCE_BACKOFF_S", 0)


def finals(events, where: str) -> dict[str, wire.FinalResult]:
    messages = [wire.decode(data) for kind, data in events if kind == where]
    return {m.request_id: m for m in messages if isinstance(m, wire.FinalResult)}


async def test_the_durable_record_comes_first_and_the_answer_is_the_same_outcome():
    loop, out, events = setup({})
    await loop._deliver(out)
    assert [kind for kind, _ in events] == ["kafka", "kafka", "redis", "redis"]
    assert finals(events, "kafka") == finals(events, "redis") and set(finals(events, "redis")) == {"a", "b"}


@pytest.mark.parametrize(
    "error, code",
    [(MessageSizeTooLargeError(), "result_too_large"), (TopicAuthorizationFailedError(), "result_refused")],
)
async def test_a_record_refused_for_good_is_answered_by_its_errored_stand_in(error, code):
    loop, out, events = setup({"a": [error]})
    await loop._deliver(out)
    durable, answered = finals(events, "kafka"), finals(events, "redis")
    assert durable == answered
    assert (answered["a"].outcome, answered["a"].error.code, answered["a"].choices) == (wire.Outcome.ERRORED, code, [])
    assert answered["b"].outcome is wire.Outcome.SUCCEEDED


async def test_transient_errors_are_retried_a_bounded_number_of_times():
    loop, out, events = setup({"a": [KafkaTimeoutError()] * (PRODUCE_ATTEMPTS - 1)})
    await loop._deliver(out)
    assert finals(events, "kafka")["a"].outcome is wire.Outcome.SUCCEEDED

    loop, out, events = setup({"a": [KafkaTimeoutError()] * PRODUCE_ATTEMPTS})
    with pytest.raises(KafkaTimeoutError):  # the broker is gone, not this result: the batch is redelivered elsewhere
        await loop._deliver(out)
    assert finals(events, "redis") == {}  # nobody was answered with an outcome that is not durable


async def test_a_record_dead_letters_refuse_is_skipped_not_retried_forever():
    from types import SimpleNamespace

    loop, out, _ = setup({})
    record = SimpleNamespace(value=b"not a batch", headers=[], key=None, offset=4)
    assert not await loop._take(record)
    await loop._deliver(out)  # offset 3's batch is answered: the commit moves past the skipped record too
    assert loop._consumer.commits == [{BATCHES: 5}]


@pytest.mark.parametrize(
    "value,headers", [(None, []), (b"{}", [("content-type", b"\xff")]), (b"\x91" * 100_000 + b"\x90", [])]
)
async def test_a_record_no_decoder_can_take_is_skipped_not_raised(value, headers):
    """A null value, a header that is not UTF-8 or nesting too deep used to raise out of _take and end the fetch."""
    from types import SimpleNamespace

    loop, out, _ = setup({})
    record = SimpleNamespace(value=value, headers=headers, key=None, offset=4)
    assert not await loop._take(record)
    await loop._deliver(out)
    assert loop._consumer.commits == [{BATCHES: 5}]

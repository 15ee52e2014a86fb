"""Redis refusing writes (maxmemory) in the result-router: a refused stored result or delivered-marker costs only
that copy and the partition keeps flowing; a refused batch-job ledger write is retried with backoff until it lands."""

from __future__ import annotations

import asyncio

from redis.exceptions import OutOfMemoryError

from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.metrics import RouterMetrics
from llmq_core.settings import Settings
from llmq_result_router.jobs import JobLedger
from llmq_result_router.loop import ResultRouter
from tests.fake_results import result_record, succeeded
from tests.fakes import FakeConsumer, FakeProducer

TP = ("llmq.results", 0)
OOM = "command not allowed when used memory > 'maxmemory'."


class FullRedis:
    """Reads work, every write is refused."""

    def register_script(self, script):
        async def refuse(keys, args):
            raise OutOfMemoryError(OOM)

        return refuse

    async def exists(self, key):
        return 0

    async def get(self, key):
        return None

    async def set(self, *args, **kwargs):
        raise OutOfMemoryError(OOM)


async def test_refused_stores_do_not_hold_up_the_partition_and_every_reply_goes_out_once():
    consumer, producer = (
        FakeConsumer(
            {TP: [result_record(0, succeeded("r0", "my.replies")), result_record(1, succeeded("r1", "my.replies"))]}
        ),
        FakeProducer({"my.replies"}),
    )
    metrics = RouterMetrics()
    router = ResultRouter(
        Settings(), consumer, producer, FullRedis(), metrics=metrics, list_topics=producer.list_topics
    )
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert producer.keys() == [("my.replies", b"r0"), ("my.replies", b"r1")]
    assert consumer.commits == [None] and consumer.seeks == []
    assert metrics.stored_dropped.labels("refused")._value.get() == 2


class RefusingLedger:
    """A ledger whose first ``refusals`` settle_many calls Redis refuses."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.settled = refusals, []

    async def line_states(self, batch_id, custom_ids):
        return ["p0" for _ in custom_ids]

    async def settle_many(self, batch_id, changes):
        if self.refusals:
            self.refusals -= 1
            raise OutOfMemoryError(OOM)
        self.settled += list(changes)
        return len(self.settled)


class NoOwners:
    async def owner(self, batch_id):
        return None


class RefusingJobStore:
    """A job store (the parts JobLedger reads) whose ledger refuses its first ``refusals`` writes."""

    def __init__(self, refusals: int) -> None:
        self.ledger, self.owners = RefusingLedger(refusals), NoOwners()


async def test_a_refused_ledger_write_is_retried_with_backoff_until_it_lands():
    store, delays = RefusingJobStore(refusals=7), []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    ledger = JobLedger(Settings(), store, producer=None, clock=FakeClock(), sleep=sleep)
    result = wire.FinalResult(
        request_id="batch_1:line-1",
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=wire.JobReply(batch_id="batch_1", custom_id="line-1"),
    )
    await ledger.on_result(result)
    assert [change.custom_id for change in store.ledger.settled] == ["line-1"]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]

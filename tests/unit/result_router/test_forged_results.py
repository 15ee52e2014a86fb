"""Forged batch-job line results on llmq.results (issue 16, item 3): the ledger accepts a line's result only for the
batch, line, tenant and round it dispatched; anything else is dropped before it is stored or settled, and counted."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec

from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.metrics import RouterMetrics
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_result_router import jobpolicy
from llmq_result_router.jobs import JobLedger
from llmq_result_router.loop import ResultRouter
from tests.fakes import FakeConsumer, FakeProducer

BATCH = "batch_x"
TP = ("llmq.results", 0)


def line_result(tenant_id="acme", request_id=None, custom_id="c1") -> wire.FinalResult:
    return wire.FinalResult(
        request_id=request_id or jobs.line_request_id(BATCH, custom_id),
        tenant_id=tenant_id,
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=wire.JobReply(batch_id=BATCH, custom_id=custom_id),
    )


def test_a_result_of_the_jobs_tenant_for_a_run_of_the_line_may_settle():
    assert jobpolicy.forgery(line_result(), "acme") is None
    assert jobpolicy.forgery(line_result(request_id=jobs.line_request_id(BATCH, "c1", 2)), "acme") is None


def test_another_tenant_an_unknown_job_or_another_request_id_is_a_forgery():
    assert jobpolicy.forgery(line_result(tenant_id="mallory"), "acme") == jobpolicy.OTHER_TENANT
    assert jobpolicy.forgery(line_result(), None) == jobpolicy.UNKNOWN_JOB
    for request_id in (f"{BATCH}:c1x", f"{BATCH}:c1:2:9", f"{BATCH}:c1:", "cmpl-123"):
        assert jobpolicy.forgery(line_result(request_id=request_id), "acme") == jobpolicy.NOT_A_LINE_ID, request_id


class TenantStore:
    """A job store that knows one job's tenant and records what the ledger settles."""

    def __init__(self) -> None:
        self.lookups, self.settled = 0, []
        self.jobs = self.owners = self.ledger = self  # it answers the calls JobLedger makes of these parts

    async def job_tenant(self, batch_id):
        self.lookups += 1
        return "acme" if batch_id == BATCH else None

    async def owner(self, batch_id):
        return None

    async def line_states(self, batch_id, custom_ids):
        return [jobs.pending(0) for _ in custom_ids]

    async def settle_many(self, batch_id, changes):
        self.settled += list(changes)


class StoringRedis:
    """Remembers whether any result was stored (the result store writes through scripts)."""

    def __init__(self) -> None:
        self.stored = []

    def register_script(self, script):
        async def run(keys, args):
            self.stored.append(keys)
            return [1, 0]

        return run

    async def exists(self, key):
        return 0


def _record(offset: int, result: wire.FinalResult):
    value = wire.encode(result)
    return SimpleNamespace(topic=TP[0], partition=TP[1], offset=offset, key=b"k", value=value, headers=[])


async def test_the_router_drops_a_forged_line_result_unstored_unsettled_and_counts_it():
    forged, genuine = line_result(tenant_id="mallory"), line_result(custom_id="c2")
    consumer, producer, redis = (
        FakeConsumer({TP: [_record(0, forged), _record(1, genuine)]}),
        FakeProducer(),
        StoringRedis(),
    )
    store, metrics = TenantStore(), RouterMetrics()
    ledger = JobLedger(Settings(), store, producer, FakeClock())
    router = ResultRouter(Settings(), consumer, producer, redis, ledger=ledger, metrics=metrics)
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert [change.custom_id for change in store.settled] == ["c2"]
    assert len(redis.stored) == 1  # only the genuine result's retrieval copy
    assert metrics.registry.get_sample_value("llmq_router_forged_results_total", {"reason": "other_tenant"}) == 1
    assert store.lookups == 1  # the job's tenant is read once, then remembered


async def test_the_ledger_remembers_only_jobs_that_exist():
    store = TenantStore()
    ledger = JobLedger(Settings(), store, FakeProducer(), FakeClock())
    unknown = msgspec.structs.replace(line_result(), reply_to=wire.JobReply(batch_id="batch_gone", custom_id="c1"))
    assert await ledger.forgery(unknown) == jobpolicy.UNKNOWN_JOB
    assert await ledger.forgery(unknown) == jobpolicy.UNKNOWN_JOB and store.lookups == 2

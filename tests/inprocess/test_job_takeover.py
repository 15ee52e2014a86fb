"""Batch-job state in Kafka, takeover and fencing across regions, on the suite's one broker and one Redis (no
MirrorMaker 2: the test copies region A's job topics to the names MirrorMaker 2 gives them in region B itself).

Region A and B are two Redis databases, two memory file stores and two sets of job topics (unique names per run); the
API pod's BatchFiles and BatchJobs create the job in A, the result-router's JobDriver and JobLedger drive and settle it
(their request producer records, the job log is the real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis
from typer.testing import CliRunner

from llmq_api.batch_jobs import render
from llmq_api.batch_jobs.batches import BatchJobs
from llmq_api.batch_jobs.builder import JobBuilder
from llmq_api.batch_jobs.files import BatchFiles
from llmq_api.ratelimit import RateLimiter
from llmq_cli.main import app
from llmq_core import constants, kafka, wire
from llmq_core.clock import FakeClock
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings
from llmq_jobs import heartbeats, jobs, regions
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog, JobTopics, read_topics
from llmq_jobs.jobs import JobOwner
from llmq_jobs.store import JobStore
from llmq_result_router import jobpolicy
from llmq_result_router.jobs import JobDriver, JobLedger
from llmq_result_router.moved import MovedJobs
from llmq_result_router.owners import OwnerWatcher
from tests.inprocess.test_batch_jobs_ledger import RETRYABLE, TENANT, RecordingProducer, _Source, line, result_for

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
A, B = f"ra{RUN}", f"rb{RUN}"
A_DB, B_DB = 11, 12


class Region:
    """One region's Redis (a database of the suite's), file store, job topics, API and result-router parts."""

    def __init__(self, settings: Settings, name: str, db: int, producer: AIOKafkaProducer, peer: str) -> None:
        base = settings.redis.url.rsplit("/", 1)[0]
        self.settings = settings.replace(
            region={"name": name, "peers": peer},
            redis={"url": f"{base}/{db}"},
            jobs={"files_url": f"memory://takeover-{name}", "batch_in_flight_lines": 4, "batch_lease_ms": 60_000},
        )
        self.name = name
        self.redis = Redis.from_url(self.settings.redis.url)
        self.topics = JobTopics(prefix=f"{name}-own.")  # this region's own job topics (production: no prefix)
        self.store = JobStore(self.redis, log=JobLog(producer, self.topics))
        self.files = FileStore(self.settings.jobs.files_url)
        self.clock = FakeClock()
        self.requests = RecordingProducer()
        models = {n: spec.context_window for n, spec in BUILTIN_MODELS.items()}
        limiter = RateLimiter(self.redis, self.clock)
        self.api_files = BatchFiles(self.settings, self.store, self.files, self.clock, limiter)
        self.api = BatchJobs(JobBuilder(self.settings, self.store, self.files, self.clock, lambda: models, limiter))
        self.ledger = JobLedger(self.settings, self.store, self.requests, self.clock)
        self.driver = JobDriver(self.settings, self.store, self.files, self.requests, self.redis, self.clock)

    async def create(self, custom_ids: list[str], extra: tuple[str, ...] = ()) -> str:
        """A job of ``custom_ids``' lines, then the raw ``extra`` lines."""
        lines = [*map(line, custom_ids), *extra]
        record = await self.api_files.upload(TENANT, "in.jsonl", "batch", _Source("\n".join(lines).encode()))
        body = json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions", "completion_window": "10m"})
        return (await self.api.create(TENANT, body.encode())).spec.id

    async def answer_all(self) -> list[str]:
        """Settle every request the driver produced since the last call; their custom_ids."""
        taken = self.requests.take()
        for request in taken:
            await self.ledger.on_result(result_for(request))
        return [r.reply_to.custom_id for r in taken]

    async def state(self, batch_id: str) -> tuple:
        job = await self.store.jobs.get_job(batch_id)
        lines = dict([item async for item in self.store.ledger.scan_lines(batch_id)])
        results = {r.reply_to.custom_id: r async for r in self.store.ledger.scan_results(batch_id)}
        return job.status, job.counts, lines, results, await self.store.owners.owner(batch_id)

    async def run_to_end(self, batch_id: str, failing=lambda custom_id, round_: False) -> None:
        """Drive the job until it ends, answering each line's run: errored retryable when ``failing(custom_id,
        round)``, succeeded otherwise; 10 s pass between steps (the retry backoff)."""
        for _ in range(40):
            await self.driver.tick()
            for request in self.requests.take():
                failed = failing(request.reply_to.custom_id, request.attempt)
                outcome, error = (wire.Outcome.ERRORED, RETRYABLE) if failed else (wire.Outcome.SUCCEEDED, None)
                await self.ledger.on_result(result_for(request, outcome, error))
            if (await self.store.jobs.get_job(batch_id)).status not in jobs.ACTIVE_STATUSES:
                return
            self.clock.advance(10_000)
        pytest.fail(f"batch {batch_id} did not end")

    async def view(self, batch_id: str) -> dict:
        """All a client and the sweeps see of a job: its batch object (status, times, file ids, request counts,
        usage, llmq's counters), its counters but the driver's round-0 progress (``produced``), its output and error
        files (records and lines), its place in its tenant's listing, its expiry."""
        job = await self.store.jobs.get_job(batch_id)
        files = {}
        for file_id in (job.spec.output_file_id, job.spec.error_file_id):
            data = b"".join([chunk async for chunk in await self.api_files.content(TENANT, file_id)])
            files[file_id] = (await self.store.files.get_file(file_id), sorted(data.splitlines()))
        listed, _ = await self.store.jobs.list_jobs(TENANT.tenant_id, None, 100)
        return {
            "batch": render.batch_object(job),
            "counts": {name: n for name, n in job.counts.items() if name != "produced"},
            "files": files,
            "listed": batch_id in [j.spec.id for j in listed],
            "expiry": await self.redis.zscore(constants.JOB_EXPIRY_KEY, batch_id),
        }

    async def output_ids(self, batch_id: str) -> list[str]:
        job = await self.store.jobs.get_job(batch_id)
        ids = []
        for file_id in (job.spec.output_file_id, job.spec.error_file_id):
            data = b"".join([chunk async for chunk in await self.api_files.content(TENANT, file_id)])
            ids += [json.loads(x)["custom_id"] for x in data.splitlines()]
        return ids


async def mirror(settings: Settings, source: Region, kinds=("specs", "lines", "ledger", "owners"), skip_last=0):
    """What MirrorMaker 2 in the peer region does: copy ``source``'s own job topics to ``<source>.llmq.jobs.*``;
    ``skip_last`` ledger records are left out (settled within the replication lag)."""
    producer = kafka.make_producer(settings)
    await producer.start()
    try:
        target = JobTopics.mirrored(source.name)
        for kind in kinds:
            await kafka.create_topic(settings, target.topic(kind))
            records = await _records(settings, source.topics.topic(kind))
            if kind == "ledger" and skip_last:
                records = records[:-skip_last]
            for key, value in records:
                await producer.send_and_wait(target.topic(kind), value, key=key)
    finally:
        await producer.stop()


async def _records(settings: Settings, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = kafka.make_consumer(settings, topic, group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    try:
        out = []
        end = sum((await consumer.end_offsets(list(consumer.assignment()))).values())
        while len(out) < end:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                out += [(r.key, r.value) for r in batch]
        return out
    finally:
        await consumer.stop()


@pytest.fixture
async def regions_pair(settings):
    producer = kafka.make_producer(settings)
    await producer.start()
    pair = [Region(settings, A, A_DB, producer, B), Region(settings, B, B_DB, producer, A)]
    for region in pair:
        await region.redis.flushdb()
        for topic in region.topics.all():
            await kafka.create_topic(settings, topic)
    yield pair
    for region in pair:
        await region.redis.flushdb()
        await region.redis.aclose()
    await producer.stop()


async def test_a_job_is_logged_taken_over_fenced_and_rebuilt(settings, regions_pair):
    a, b = regions_pair
    custom_ids = [f"line-{i}" for i in range(10)]
    batch_id = await a.create(custom_ids)

    # A drives: 4 lines in flight, all settled; the last settlement is not mirrored before A is lost
    await a.driver.tick()
    settled_in_a = await a.answer_all()
    assert len(settled_in_a) == 4
    logged = await read_topics(a.settings, a.topics)
    assert logged.records[batch_id].status == jobs.IN_PROGRESS
    assert list(logged.lines[batch_id]) == custom_ids
    assert set(logged.results[batch_id]) == set(settled_in_a)
    assert logged.owners[batch_id] == JobOwner(
        batch_id=batch_id, region=A, epoch=0, at_ms=logged.owners[batch_id].at_ms
    )
    await mirror(settings, a, skip_last=1)

    # B takes the job over under the same batch id, epoch 1; the 3 mirrored settlements are not run again
    [taken] = await regions.take_over(b.settings, b.store, b.files, b.store.log, A, b.clock)
    assert (taken.batch_id, taken.status, taken.epoch, taken.settled, taken.to_run) == (
        batch_id,
        jobs.IN_PROGRESS,
        1,
        3,
        7,
    )
    status, _, lines, results, owner = await b.state(batch_id)
    assert (status, owner) == (jobs.IN_PROGRESS, B)
    assert set(results) == set(settled_in_a[:3])
    assert sum(state == jobs.pending(0) for state in lines.values()) == 7

    # fencing: A learns of B's claim (B's owners topic mirrored to A) and neither drives nor settles the job again
    await mirror(settings, b, kinds=("owners",))
    consumer = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    watcher = OwnerWatcher(a.store, consumer, A, (B,))
    await consumer.start()
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.caught_up.wait(), 30)
    finally:
        watcher.stop()
        await task
        await consumer.stop()
    assert await a.store.owners.owner(batch_id) == B
    await a.driver.tick()
    assert a.requests.take() == []
    assert batch_id not in await a.store.jobs.active_jobs()
    late = wire.FinalResult(
        request_id=f"{batch_id}:line-9",
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        tenant_id=TENANT.tenant_id,
        reply_to=wire.JobReply(batch_id=batch_id, custom_id="line-9"),
    )
    await a.ledger.on_result(late)  # a result of A's that arrives late: A's ledger leaves the line alone
    assert await a.store.ledger.line_states(batch_id, ["line-9"]) == [jobs.pending(0)]

    # B finishes the job: every custom_id exactly once across its output and error files
    rerun = []
    for _ in range(10):
        await b.driver.tick()
        rerun += await b.answer_all()
        await b.driver.tick()
    assert sorted(rerun) == sorted(set(custom_ids) - set(settled_in_a[:3]))
    assert (await b.store.jobs.get_job(batch_id)).status == jobs.COMPLETED
    assert sorted(await b.output_ids(batch_id)) == sorted(custom_ids)

    # A's last settlement reaches B once A is back: one line ran in both regions, counted as a rerun
    await mirror(settings, a, kinds=("ledger",))
    reruns = await regions.count_reruns(b.settings, JobTopics.mirrored(A), {batch_id}, own=b.topics)
    assert reruns == {batch_id: 1}

    # B's Redis is lost: the view rebuilt from B's own topics serves the same job and files
    before = (await b.store.jobs.get_job(batch_id)).status, sorted(await b.output_ids(batch_id))
    await b.redis.flushdb()
    assert await regions.rebuild(b.settings, b.store, b.files, own=b.topics) == 1
    assert ((await b.store.jobs.get_job(batch_id)).status, sorted(await b.output_ids(batch_id))) == before
    assert await b.store.owners.owner(batch_id) == B


@contextlib.asynccontextmanager
async def following(settings: Settings, region: Region, peer: str):
    """``region``'s result-router parts that follow the peer's mirrored topics: the owner watcher (fencing) and the
    view of the jobs moved to the peer, running until the block ends."""
    consumers = [kafka.make_consumer(settings, group_id=None, auto_offset_reset="earliest") for _ in range(2)]
    for consumer in consumers:
        await consumer.start()
    moved = MovedJobs(region.settings, region.store, region.files, consumers[0], (peer,))
    watcher = OwnerWatcher(region.store, consumers[1], region.name, (peer,), moved.moved)
    tasks = [asyncio.create_task(part.run()) for part in (moved, watcher)]
    try:
        yield
    finally:
        for part in (moved, watcher):
            part.stop()
        await asyncio.gather(*tasks)
        for consumer in consumers:
            await consumer.stop()


async def until(condition, timeout_s: float = 30) -> None:
    """Wait until ``await condition()`` holds (the followers apply what is mirrored in the background)."""
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.05)


async def test_the_old_regions_view_of_a_moved_job_follows_the_new_owner_to_its_end(settings, regions_pair):
    a, b = regions_pair
    custom_ids = [f"line-{i}" for i in range(10)]
    batch_id = await a.create(custom_ids)
    await a.driver.tick()
    await a.answer_all()
    await mirror(settings, a, skip_last=1)
    await regions.take_over(b.settings, b.store, b.files, b.store.log, A, b.clock)
    # A, alive and not yet knowing, settles 4 more lines; B runs the unsettled lines among the first ones it reads
    await a.driver.tick()
    assert len(await a.answer_all()) == 4
    for _ in range(2):
        await b.driver.tick()
        await b.answer_all()
    settled = (await a.view(batch_id))["batch"]["request_counts"]["completed"], len((await b.state(batch_id))[3])
    await mirror(settings, b, kinds=("specs", "ledger"))  # B's progress may reach A before its claim does

    async def same_progress() -> bool:
        mine, theirs = await a.view(batch_id), await b.view(batch_id)
        return (mine["batch"], mine["counts"]) == (theirs["batch"], theirs["counts"])

    async with following(settings, a, B):
        await mirror(settings, b, kinds=("owners",))
        await until(same_progress)  # A shows B's progress, not its own 8 settled lines
        view = await a.view(batch_id)
        assert (view["batch"]["status"], view["batch"]["llmq"]["owner_region"]) == (jobs.IN_PROGRESS, B)
        assert settled[0] == 8 and view["batch"]["request_counts"] == {
            "total": 10,
            "completed": settled[1],
            "failed": 0,
        }
        assert view["files"] == (await b.view(batch_id))["files"]

        await b.run_to_end(batch_id)
        await mirror(settings, b, kinds=("specs", "ledger"))

        async def ended_alike() -> bool:
            return await a.view(batch_id) == await b.view(batch_id)

        await until(ended_alike)  # status, times, counts, usage, output and error files, expiry: B's
    view = await a.view(batch_id)
    assert (view["batch"]["status"], view["batch"]["llmq"]["owner_region"]) == (jobs.COMPLETED, B)
    assert sorted(await a.output_ids(batch_id)) == custom_ids
    assert batch_id not in await a.store.jobs.active_jobs()


async def test_a_rebuilt_view_of_a_running_job_is_the_same(settings, regions_pair):
    a, _ = regions_pair
    batch_id = await a.create([f"line-{i}" for i in range(6)])
    await a.driver.tick()
    await a.answer_all()
    before = await a.state(batch_id)
    await a.redis.flushdb()
    await regions.rebuild(a.settings, a.store, a.files, own=a.topics)
    status, counts, lines, results, owner = await a.state(batch_id)
    assert (status, lines, results, owner) == before[:1] + before[2:]
    assert {k: counts[k] for k in ("succeeded", "errored", "input_tokens", "output_tokens")} == {
        k: before[1][k] for k in ("succeeded", "errored", "input_tokens", "output_tokens")
    }


def flaky(custom_id: str, round_: int) -> bool:
    """line-0 fails its first run, line-1 every run (a dead letter after its last round): both are retried."""
    return (custom_id, round_) == ("line-0", 0) or custom_id == "line-1"


async def test_an_ended_jobs_rebuilt_view_equals_the_one_before_field_by_field(settings, regions_pair):
    a, _ = regions_pair
    batch_id = await a.create([f"line-{i}" for i in range(6)], extra=(line("bad", temperature=5),))
    await a.run_to_end(batch_id, flaky)
    before = await a.view(batch_id)
    counts = before["batch"]["request_counts"], before["batch"]["llmq"]
    assert counts == (
        {"total": 7, "completed": 5, "failed": 2},
        {"succeeded": 5, "errored": 2, "canceled": 0, "expired": 0, "retried": 4, "dead_letters": 1, "owner_region": A},
    )
    assert before["batch"]["usage"]["total_tokens"] > 0 and before["expiry"] is not None
    await a.redis.flushdb()
    await regions.rebuild(a.settings, a.store, a.files, own=a.topics)
    assert await a.view(batch_id) == before


def owned_by(view: dict, region: str) -> dict:
    """``view`` as it reads with ``region`` owning the job."""
    return {**view, "batch": {**view["batch"], "llmq": {**view["batch"]["llmq"], "owner_region": region}}}


async def test_an_ended_job_taken_over_and_failed_back_keeps_its_view_through_a_rebuild(settings, regions_pair):
    a, b = regions_pair
    batch_id = await a.create([f"line-{i}" for i in range(4)])
    await a.run_to_end(batch_id, flaky)
    before = await a.view(batch_id)
    await mirror(settings, a)
    taken = await regions.take_over(b.settings, b.store, b.files, b.store.log, A, b.clock)
    assert [(t.status, t.settled) for t in taken if t.batch_id == batch_id] == [(jobs.COMPLETED, 4)]
    assert await b.view(batch_id) == owned_by(before, B)  # the same, but the region that owns it now
    await mirror(settings, b)
    back = await regions.take_over(a.settings, a.store, a.files, a.store.log, B, a.clock, failback=True)
    assert [t.epoch for t in back if t.batch_id == batch_id] == [2]
    assert await a.view(batch_id) == before
    await a.redis.flushdb()
    await regions.rebuild(a.settings, a.store, a.files, own=a.topics)
    assert await a.view(batch_id) == before
    assert await a.store.owners.owner(batch_id) == A


async def test_a_result_that_lost_the_race_to_settle_its_line_is_not_the_one_the_log_keeps(settings, regions_pair):
    a, _ = regions_pair
    batch_id = await a.create(["line-0", "line-1"])
    await a.driver.tick()
    first, second = a.requests.take()
    # a cancel read both lines unsettled; before its changes apply, line-0 succeeds and line-1 waits for a retry round
    now_ms = a.clock.now_ms()
    cancels = [
        jobpolicy.end_line(batch_id, c, jobs.pending(0), wire.Outcome.CANCELED, now_ms) for c in ("line-0", "line-1")
    ]
    await a.ledger.on_result(result_for(first))
    await a.ledger.on_result(result_for(second, wire.Outcome.ERRORED, RETRYABLE))
    assert await a.store.ledger.settle_many(batch_id, cancels) == 0
    logged = (await read_topics(a.settings, a.topics, kinds=("ledger",))).results[batch_id]
    assert logged == {r.reply_to.custom_id: r async for r in a.store.ledger.scan_results(batch_id)}
    assert list(logged) == ["line-0"] and logged["line-0"].outcome is wire.Outcome.SUCCEEDED


def heartbeat(source: str, target: str, at_ms: int) -> tuple[bytes, bytes]:
    """A heartbeat record as MirrorMaker 2 writes it (key: the two aliases; value: version 0, epoch ms)."""
    key = b"".join(struct.pack(">h", len(alias)) + alias.encode() for alias in (source, target))
    return key, struct.pack(">hq", 0, at_ms)


async def test_a_failover_is_refused_while_the_sources_inbound_mirror_does_not_beat_unless_forced(
    settings, monkeypatch
):
    lost, here = f"rc{RUN}", f"rd{RUN}"  # regions with no jobs mirrored: a forced failover takes none
    base = settings.redis.url.rsplit("/", 1)[0]
    env = {"LLMQ_REGION": here, "LLMQ_REGION_PEERS": lost, "LLMQ_REDIS_URL": f"{base}/{B_DB}"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    async def failover(*flags: str):
        return await asyncio.to_thread(CliRunner().invoke, app, ["region", "failover", "--from", lost, *flags])

    refused = await failover()  # nothing of lost's cluster has reached here
    assert refused.exit_code == 2
    assert f"no heartbeat of MirrorMaker 2 {here}->{lost} in {lost}.heartbeats" in refused.output
    assert "--force" in refused.output

    topic = heartbeats.heartbeats_topic(lost)
    await kafka.create_topic(settings, topic)
    producer = kafka.make_producer(settings)
    await producer.start()
    try:
        now_ms = int(time.time() * 1000)
        for source, target, at_ms in [(here, lost, now_ms - 60_000), ("other", lost, now_ms), (lost, here, now_ms)]:
            key, value = heartbeat(source, target, at_ms)
            await producer.send_and_wait(topic, value, key=key)
        stale = await failover()  # the inbound mirror stopped a minute ago; other flows' beats do not count
        assert stale.exit_code == 2
        assert f"heartbeat of MirrorMaker 2 {here}->{lost} in {topic} is 6" in stale.output

        forced = await failover("--force")
        assert forced.exit_code == 0, forced.output
        assert json.loads(forced.stdout.splitlines()[-1])["taken_over"] == 0

        key, value = heartbeat(here, lost, int(time.time() * 1000))
        await producer.send_and_wait(topic, value, key=key)
        beating = await failover()
        assert beating.exit_code == 0, beating.output
    finally:
        await producer.stop()

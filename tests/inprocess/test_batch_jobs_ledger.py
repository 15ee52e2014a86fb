"""Batch jobs against a real Redis, without Kafka: the API pod's BatchFiles and BatchJobs create files and jobs, the
result-router's JobDriver drives them (its producer is a recorder), JobLedger settles results fed in by hand, time is a
FakeClock."""

from __future__ import annotations

import json
import uuid

import pytest
from redis.asyncio import Redis

from llmq_api import validation
from llmq_api.auth import Principal
from llmq_api.batch_jobs import render
from llmq_api.batch_jobs.batches import BatchJobs
from llmq_api.batch_jobs.builder import JobBuilder, line_result_bytes
from llmq_api.batch_jobs.files import MAX_FILES_PAGE, BatchFiles
from llmq_api.batch_jobs.message_batches import MessageBatches
from llmq_api.errors import ApiError
from llmq_api.ratelimit import RateLimiter
from llmq_core import constants, security, wire
from llmq_core.clock import FakeClock
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog, JobSnapshot
from llmq_jobs.jobs import JobOwner
from llmq_jobs.store import JobStore
from llmq_result_router.jobs import JobDriver, JobLedger
from tests.fake_results import fake_result

pytestmark = pytest.mark.integration

TENANT = Principal(tenant_id=f"ledger-{uuid.uuid4().hex[:8]}")
OTHER = Principal(tenant_id=f"other-{uuid.uuid4().hex[:8]}")
WINDOW_MS = 600_000


class RecordingProducer:
    """Stands in for the Kafka producer: keeps every record sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        self.sent.append((topic, value, key))

    def requests(self) -> list[wire.GenerationRequest]:
        return [wire.decode(v) for t, v, _ in self.sent if t == constants.requests_topic(constants.DEFERRED)]

    def take(self) -> list[wire.GenerationRequest]:
        requests = self.requests()
        self.sent.clear()
        return requests


class Harness:
    def __init__(self, redis: Redis, **jobs) -> None:
        self.settings = Settings(
            jobs={
                "files_url": f"memory://ledger-{uuid.uuid4().hex}",
                "batch_in_flight_lines": 4,
                "batch_max_rounds": 2,
                "batch_retry_backoff_ms": 1000,
                "batch_end_grace_ms": 1000,
                "batch_lease_ms": 60_000,
                **jobs,
            }
        )
        self.clock = FakeClock()
        self.redis = redis
        self.store = JobStore(redis)
        self.files = FileStore(self.settings.jobs.files_url)
        self.producer = RecordingProducer()
        models = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
        limiter = RateLimiter(redis, self.clock)
        self.api_files = BatchFiles(self.settings, self.store, self.files, self.clock, limiter)
        self.api = BatchJobs(JobBuilder(self.settings, self.store, self.files, self.clock, lambda: models, limiter))
        self.messages = MessageBatches(self.api.builder)
        self.ledger = JobLedger(self.settings, self.store, self.producer, self.clock)
        self.driver = self.new_driver()
        self.created: list[str] = []

    def new_driver(self) -> JobDriver:
        return JobDriver(self.settings, self.store, self.files, self.producer, self.redis, self.clock)

    async def create(self, lines: list[str], principal: Principal = TENANT, window: str = "10m"):
        record = await self.api_files.upload(principal, "in.jsonl", "batch", _Source("\n".join(lines).encode()))
        body = json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions", "completion_window": window})
        job = await self.api.create(principal, body.encode())
        self.created.append(job.spec.id)
        return job

    async def cleanup(self) -> None:
        """Forget this test's jobs, so no result-router sharing this Redis ever picks them up."""
        for batch_id in self.created:
            await self.redis.srem(constants.ACTIVE_JOBS_KEY, batch_id)
            await self.redis.delete(
                *(
                    key(batch_id)
                    for key in (
                        constants.job_key,
                        constants.job_lines_key,
                        constants.job_offsets_key,
                        constants.job_results_key,
                        constants.job_retries_key,
                        constants.job_lease_key,
                    )
                )
            )

    async def job(self, batch_id: str):
        return await self.store.jobs.get_job(batch_id)

    async def answer(self, request: wire.GenerationRequest, outcome=wire.Outcome.SUCCEEDED, error=None):
        await self.ledger.on_result(result_for(request, outcome, error))

    async def lines(self, job, kind: str) -> list[dict]:
        record = await self.store.files.get_file(
            job.spec.output_file_id if kind == "output" else job.spec.error_file_id
        )
        chunks = await self.api_files.content(TENANT, record.id)
        return [json.loads(line) for line in b"".join([c async for c in chunks]).splitlines()]


class _Source:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk


def line(custom_id: str, prompt: str = "hello", **body) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "llmq-sim", "prompt": prompt, "max_tokens": 4, **body},
        }
    )


def result_for(request: wire.GenerationRequest, outcome=wire.Outcome.SUCCEEDED, error=None) -> wire.FinalResult:
    text = request.prompt[: request.sampling.max_tokens] if outcome is wire.Outcome.SUCCEEDED else ""
    return fake_result(request, outcome, text, error=error)


RETRYABLE = wire.ErrorInfo(type="engine_error", message="worker lost", retryable=True)


@pytest.fixture
async def harness():
    redis = Redis.from_url(Settings().redis.url)
    harness = Harness(redis)
    yield harness
    await harness.cleanup()
    await redis.aclose()


async def test_lines_run_in_a_window_each_settles_once_and_the_job_completes(harness):
    job = await harness.create([line(f"c{i}", f"prompt {i}") for i in range(10)] + [line("bad", temperature=5)])
    batch_id = job.spec.id
    assert job.status == jobs.IN_PROGRESS and job.spec.total == 11 and job.spec.runnable == 10
    assert job.count("errored") == 1  # the invalid body errs alone, at creation
    await harness.driver.drive(batch_id)
    first = harness.producer.take()
    assert len(first) == 4  # the in-flight window
    assert {r.traffic_class for r in first} == {"deferred"}
    assert first[0].reply_to == wire.JobReply(batch_id=batch_id, custom_id="c0")
    assert first[0].request_id == jobs.line_request_id(batch_id, "c0")
    await harness.driver.drive(batch_id)
    assert harness.producer.take() == []  # window full: nothing more until results arrive
    for request in first:
        await harness.answer(request)
        await harness.answer(request)  # a redelivered result counts once
    seen = list(first)
    while (job := await harness.job(batch_id)).status == jobs.IN_PROGRESS:
        await harness.driver.drive(batch_id)
        batch = harness.producer.take()
        seen += batch
        for request in batch:
            await harness.answer(request)
    assert sorted(r.reply_to.custom_id for r in seen) == sorted(f"c{i}" for i in range(10))
    assert job.status == jobs.COMPLETED and job.times.keys() >= {"finalizing", "completed"}
    assert (job.count("succeeded"), job.count("errored")) == (10, 1)
    output, errors = await harness.lines(job, "output"), await harness.lines(job, "error")
    assert sorted(x["custom_id"] for x in output) == sorted(f"c{i}" for i in range(10))
    assert [x["custom_id"] for x in errors] == ["bad"] and errors[0]["response"]["status_code"] == 400
    assert job.count("input_tokens") == sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in output)
    assert not await harness.redis.exists(constants.job_lines_key(batch_id))  # ledger retired into the results file
    assert batch_id not in await harness.store.jobs.active_jobs()


async def test_retry_rounds_wait_for_their_backoff_use_new_ids_and_end_as_dead_letters(harness):
    job = await harness.create([line("flaky"), line("doomed")])
    batch_id = job.spec.id
    await harness.driver.drive(batch_id)
    round0 = {r.reply_to.custom_id: r for r in harness.producer.take()}
    for request in round0.values():
        await harness.answer(request, wire.Outcome.ERRORED, RETRYABLE)
    await harness.driver.drive(batch_id)
    assert harness.producer.take() == []  # backoff of round 1: 1000 ms
    harness.clock.advance(1000)
    await harness.driver.drive(batch_id)
    round1 = {r.reply_to.custom_id: r for r in harness.producer.take()}
    assert set(round1) == {"flaky", "doomed"}
    assert round1["flaky"].request_id == jobs.line_request_id(batch_id, "flaky", 1) and round1["flaky"].attempt == 1
    await harness.answer(round0["flaky"])  # a late result of round 0 is stale: ignored
    assert (await harness.job(batch_id)).count("succeeded") == 0
    await harness.answer(round1["flaky"])
    await harness.answer(round1["doomed"], wire.Outcome.ERRORED, RETRYABLE)
    harness.clock.advance(1999)
    await harness.driver.drive(batch_id)
    assert harness.producer.take() == []  # round 2 waits 2000 ms
    harness.clock.advance(1)
    await harness.driver.drive(batch_id)
    [round2] = harness.producer.take()
    await harness.answer(round2, wire.Outcome.ERRORED, RETRYABLE)
    dead = [(t, wire.decode(v)) for t, v, _ in harness.producer.sent if t == constants.TOPIC_DEAD_LETTERS]
    assert [r.request_id for _, r in dead] == [jobs.line_request_id(batch_id, "doomed", 2)]
    await harness.driver.drive(batch_id)
    job = await harness.job(batch_id)
    assert job.status == jobs.COMPLETED
    assert {k: job.count(k) for k in ("succeeded", "errored", "retried", "dead_letters")} == {
        "succeeded": 1,
        "errored": 1,
        "retried": 3,
        "dead_letters": 1,
    }
    [error] = await harness.lines(job, "error")
    assert error["custom_id"] == "doomed" and error["dead_letter"] and error["response"]["status_code"] == 503


async def test_a_restarted_driver_reproduces_only_unsettled_lines_with_the_same_ids(harness):
    job = await harness.create([line(f"c{i}") for i in range(4)])
    batch_id = job.spec.id
    await harness.driver.drive(batch_id)
    first = harness.producer.take()
    for request in first[:2]:
        await harness.answer(request)
    # A crash after producing but before saving the cursor: the next driver starts from byte 0 again.
    await harness.redis.hset(constants.job_key(batch_id), mapping={"cursor": 0, "produced": 0})
    await harness.store.leases.release_lease(batch_id, harness.driver.token)
    await harness.new_driver().drive(batch_id)
    again = harness.producer.take()
    assert [r.request_id for r in again] == [r.request_id for r in first[2:]]


async def test_another_driver_waits_for_the_lease(harness):
    job = await harness.create([line("a")])
    other = harness.new_driver()
    assert await harness.store.leases.hold_lease(job.spec.id, harness.driver.token, 60_000)
    assert not await harness.store.leases.hold_lease(job.spec.id, other.token, 60_000)
    await harness.store.leases.release_lease(job.spec.id, harness.driver.token)
    assert await harness.store.leases.hold_lease(job.spec.id, other.token, 60_000)


async def test_cancel_ends_waiting_lines_cancels_running_ones_and_bills_only_what_succeeded(harness):
    job = await harness.create([line(f"c{i}") for i in range(8)])
    batch_id = job.spec.id
    await harness.driver.drive(batch_id)
    running = harness.producer.take()
    await harness.answer(running[0])
    pubsub = harness.redis.pubsub()
    await pubsub.subscribe(constants.REDIS_CANCELS_CHANNEL)
    cancelled = await harness.api.cancel(TENANT, batch_id)
    assert cancelled.status == jobs.CANCELLING
    await harness.driver.drive(batch_id)
    job = await harness.job(batch_id)
    assert job.count("canceled") == 4  # the four never produced
    wanted, cancels = {r.request_id for r in running[1:]}, set()
    for _ in range(50):  # until the three cancels arrived (each read waits at most 0.1 s)
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            cancels.add(wire.decode(message["data"]).request_id)
        if cancels >= wanted:
            break
    await pubsub.aclose()
    assert cancels >= wanted
    await harness.answer(running[1], wire.Outcome.CANCELED)  # a worker obeyed the cancel (with partial usage)
    await harness.answer(running[2])  # one finished before the cancel reached it
    harness.clock.advance(1000)  # the grace is over: the last running line is ended by the driver
    await harness.driver.drive(batch_id)
    await harness.driver.drive(batch_id)
    job = await harness.job(batch_id)
    assert job.status == jobs.CANCELLED
    assert (job.count("succeeded"), job.count("canceled")) == (2, 6)
    output, errors = await harness.lines(job, "output"), await harness.lines(job, "error")
    assert job.count("input_tokens") + job.count("output_tokens") == sum(
        x["response"]["body"]["usage"]["total_tokens"] for x in output
    )
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"} and len(errors) == 6
    with pytest.raises(ApiError) as again:
        await harness.api.cancel(OTHER, batch_id)
    assert again.value.status == 404
    assert (await harness.api.cancel(TENANT, batch_id)).status == jobs.CANCELLED


async def test_the_window_ends_unfinished_lines_expired(harness):
    job = await harness.create([line(f"c{i}") for i in range(6)], window="90s")
    batch_id = job.spec.id
    await harness.driver.drive(batch_id)
    running = harness.producer.take()
    assert {r.deadline_ms for r in running} == {job.spec.expires_ms}
    await harness.answer(running[0])
    harness.clock.set(job.spec.expires_ms)
    await harness.driver.drive(batch_id)
    assert harness.producer.take() == []
    assert (await harness.job(batch_id)).count("expired") == 2  # never produced
    await harness.answer(running[1], wire.Outcome.EXPIRED)  # the batcher expired it at its deadline
    harness.clock.advance(1000)
    await harness.driver.drive(batch_id)
    await harness.driver.drive(batch_id)
    job = await harness.job(batch_id)
    assert job.status == jobs.EXPIRED and (job.count("succeeded"), job.count("expired")) == (1, 5)
    body = render.batch_object(job)
    assert body["expired_at"] is not None and body["request_counts"] == {"total": 6, "completed": 1, "failed": 5}


async def test_partial_results_are_readable_while_the_job_runs(harness):
    job = await harness.create([line(f"c{i}") for i in range(3)])
    await harness.driver.drive(job.spec.id)
    requests = harness.producer.take()
    assert await harness.lines(job, "output") == []
    await harness.answer(requests[0])
    partial = await harness.lines(job, "output")
    assert [x["custom_id"] for x in partial] == [requests[0].reply_to.custom_id]


async def test_structural_faults_fail_the_batch_with_openai_errors(harness):
    job = await harness.create([line("a"), "not json", line("a")])
    assert job.status == jobs.FAILED and job.spec.total == 0
    assert [(e.code, e.line) for e in job.errors] == [("invalid_json_line", 2), ("duplicate_custom_id", 3)]
    assert job.spec.id not in await harness.store.jobs.active_jobs()
    body = render.batch_object(job)
    assert body["errors"]["object"] == "list" and body["failed_at"] is not None


async def test_files_and_batches_belong_to_their_tenant(harness):
    job = await harness.create([line("a")])
    record = await harness.store.files.get_file(job.spec.input_file_id)
    for call in (
        harness.api_files.get_file(OTHER, record.id),
        harness.api_files.content(OTHER, record.id),
        harness.api_files.delete_file(OTHER, record.id),
        harness.api.get(OTHER, job.spec.id),
        harness.api_files.content(OTHER, job.spec.output_file_id),
    ):
        with pytest.raises(ApiError) as caught:
            await call
        assert caught.value.status == 404
    assert record.id not in [r.id for r in (await harness.api_files.list_files(OTHER, None, None, 100))[0]]
    assert job.spec.id not in [j.spec.id for j in (await harness.api.list(OTHER, None, 100))[0]]
    assert job.spec.id in [j.spec.id for j in (await harness.api.list(TENANT, None, 100))[0]]


async def test_listing_pages_newest_first(harness):
    tenant = Principal(tenant_id=f"pages-{uuid.uuid4().hex[:8]}")
    ids = []
    for _ in range(5):
        ids.append((await harness.create([line("a")], principal=tenant)).spec.id)
        harness.clock.advance(1)
    page, more = await harness.api.list(tenant, None, 2)
    assert [j.spec.id for j in page] == ids[::-1][:2] and more
    page, more = await harness.api.list(tenant, page[-1].spec.id, 2)
    assert [j.spec.id for j in page] == ids[::-1][2:4] and more
    page, more = await harness.api.list(tenant, page[-1].spec.id, 2)
    assert [j.spec.id for j in page] == ids[:1] and not more


async def _chunks(data: bytes, size: int = 7):
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_a_message_batch_runs_on_the_same_engine_its_tenant_alone_sees_it_and_it_is_kept_29_days(harness):
    """A Message Batch through the same driver and ledger as /v1/batches: its lines are the same deferred requests
    (Anthropic's format), another tenant and /v1/batches get 404, and it is forgotten at its own retention."""
    params = {"model": "llmq-sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
    body = json.dumps({"requests": [{"custom_id": f"m{i}", "params": params} for i in range(3)]}).encode()
    batch = await harness.messages.create(TENANT, _chunks(body))
    harness.created.append(batch.spec.id)
    assert batch.spec.api_format == constants.ANTHROPIC and batch.spec.total == 3 and batch.status == jobs.IN_PROGRESS
    with pytest.raises(ApiError) as refused:
        await harness.messages.delete(TENANT, batch.spec.id)
    assert refused.value.status == 400
    for service in (harness.messages.get, harness.messages.results, harness.messages.cancel, harness.messages.delete):
        with pytest.raises(ApiError) as hidden:
            await service(OTHER, batch.spec.id)
        assert hidden.value.status == 404
    with pytest.raises(ApiError):
        await harness.api.get(TENANT, batch.spec.id)
    assert batch.spec.id not in [j.spec.id for j in (await harness.api.list(TENANT, None, 100))[0]]
    assert [j.spec.id for j in (await harness.messages.list(TENANT, None, None, 1))[0]] == [batch.spec.id]
    while (job := await harness.job(batch.spec.id)).status == jobs.IN_PROGRESS:
        await harness.driver.drive(batch.spec.id)
        for request in harness.producer.take():
            assert request.api_format == constants.ANTHROPIC and request.traffic_class == constants.DEFERRED
            await harness.ledger.on_result(fake_result(request, wire.Outcome.SUCCEEDED, "hell"))
    assert job.status == jobs.COMPLETED and job.count("succeeded") == 3
    lines = [
        json.loads(x)
        async for chunk in await harness.messages.results(TENANT, batch.spec.id)
        for x in chunk.splitlines()
    ]
    assert sorted(x["custom_id"] for x in lines) == ["m0", "m1", "m2"]
    assert {x["result"]["message"]["content"][0]["text"] for x in lines} == {"hell"}
    ended_s = job.times[jobs.COMPLETED]
    retention_s = harness.settings.jobs.message_batch_retention_s
    assert retention_s == 29 * 86_400
    await harness.driver.sweep_files(ended_s + retention_s - 1)
    assert await harness.messages.get(TENANT, batch.spec.id)
    assert await harness.files.exists(batch.spec.results_path)
    await harness.driver.sweep_files(ended_s + retention_s)
    with pytest.raises(ApiError) as gone:
        await harness.messages.get(TENANT, batch.spec.id)
    assert gone.value.status == 404 and not await harness.files.exists(batch.spec.results_path)


async def test_expired_files_are_swept(harness):
    record = await harness.api_files.upload(TENANT, "x.jsonl", "batch", _Source(b"{}"))
    await harness.driver.sweep_files(record.expires_at)
    assert await harness.store.files.get_file(record.id) is None
    assert not await harness.files.exists(record.path)


async def test_an_idempotency_key_returns_the_same_batch_and_runs_nothing_twice(harness):
    tenant = Principal(tenant_id=f"idem-{uuid.uuid4().hex[:8]}")
    record = await harness.api_files.upload(tenant, "in.jsonl", "batch", _Source(line("a").encode()))
    body = json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions"}).encode()
    key = f"k-{uuid.uuid4().hex}"
    first = await harness.api.create(tenant, body, key)
    again = await harness.api.create(tenant, body, key)
    harness.created.append(first.spec.id)
    assert again.spec.id == first.spec.id
    assert [j.spec.id for j in (await harness.api.list(tenant, None, 100))[0]] == [first.spec.id]
    fresh = await harness.api.create(tenant, body, f"k-{uuid.uuid4().hex}")
    harness.created.append(fresh.spec.id)
    assert fresh.spec.id != first.spec.id


async def test_a_failed_creation_releases_its_idempotency_key(harness):
    key = f"k-{uuid.uuid4().hex}"
    body = json.dumps({"input_file_id": "file-missing", "endpoint": "/v1/completions"}).encode()
    with pytest.raises(ApiError):
        await harness.api.create(TENANT, body, key)
    record = await harness.api_files.upload(TENANT, "in.jsonl", "batch", _Source(line("a").encode()))
    body = json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions"}).encode()
    job = await harness.api.create(TENANT, body, key)
    harness.created.append(job.spec.id)
    assert job.status == jobs.IN_PROGRESS


async def test_an_api_pod_writes_only_a_jobs_record_and_lines_to_the_job_log(harness):
    """Issue 34, item 2: the `api` principal could write every llmq.jobs.* topic because a create wrote a claim
    (owners) and the refused lines' results (ledger). A create and a cancel now write only topics the api role's ACLs
    allow (records and lines); the job log still holds everything: the refused line's result rides on its lines
    record, and the creating region's claim is the job's id."""
    recorder = RecordingProducer()
    store = JobStore(harness.redis, log=JobLog(recorder))
    models = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
    limiter = RateLimiter(harness.redis, harness.clock)
    api = BatchJobs(JobBuilder(harness.settings, store, harness.files, harness.clock, lambda: models, limiter))
    source = _Source("\n".join([line("ok"), line("bad", temperature=5)]).encode())
    record = await harness.api_files.upload(TENANT, "in.jsonl", "batch", source)
    job = await api.create(TENANT, json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions"}).encode())
    harness.created.append(job.spec.id)
    await api.cancel(TENANT, job.spec.id)
    written = {topic for topic, _, _ in recorder.sent}
    assert written == {constants.job_topic("specs"), constants.job_topic("lines")}
    granted = [a for a in security.kafka_acls() if a.principal == security.ROLE_API and a.operation == security.WRITE]
    assert all(any(t == a.name or (a.prefixed and t.startswith(a.name)) for a in granted) for t in written)
    snapshot = JobSnapshot(region=harness.settings.region.name)
    for topic, value, key in recorder.sent:
        snapshot.apply(topic.removeprefix(constants.TOPIC_JOBS_PREFIX), key, value)
    batch_id = job.spec.id
    assert snapshot.records[batch_id].status == jobs.CANCELLING
    assert list(snapshot.lines[batch_id]) == ["ok"]
    assert snapshot.results[batch_id]["bad"].outcome is wire.Outcome.ERRORED
    assert snapshot.owners[batch_id] == JobOwner(batch_id=batch_id, region=harness.settings.region.name)


async def test_a_router_that_cannot_drive_a_job_hands_it_over(harness):
    job = await harness.create([line("a")])
    await harness.files.delete(job.spec.prepared_path)  # this router's file store lacks the job's files
    broken = harness.new_driver()
    await broken.step(job.spec.id)
    other = harness.new_driver()
    assert await harness.store.leases.hold_lease(job.spec.id, other.token, 60_000)


async def test_result_bytes_are_bounded_per_job_and_per_tenant_and_come_back_when_a_job_ends():
    redis = Redis.from_url(Settings().redis.url)
    per_line = line_result_bytes(
        validation.parse_completion(json.dumps(json.loads(line("x"))["body"]).encode(), {"llmq-sim": 0}), 0
    )
    harness = Harness(redis, batch_job_max_result_bytes=5 * per_line, batch_tenant_max_result_bytes=7 * per_line)
    tenant = Principal(tenant_id=f"bytes-{uuid.uuid4().hex[:8]}")
    counter = constants.tenant_result_bytes_key(tenant.tenant_id)
    try:
        with pytest.raises(ApiError) as too_large:
            await harness.create([line(f"c{i}") for i in range(6)], tenant)
        assert (too_large.value.status, too_large.value.code) == (400, "batch_results_too_large")
        first = await harness.create([line(f"c{i}") for i in range(4)], tenant)
        assert first.spec.result_bytes == 4 * per_line and int(await redis.get(counter)) == 4 * per_line
        with pytest.raises(ApiError) as busy:
            await harness.create([line(f"c{i}") for i in range(4)], tenant)
        assert (busy.value.status, busy.value.code) == (429, "batch_results_quota_exceeded")
        assert busy.value.response_headers()["x-should-retry"] == "false"
        assert int(await redis.get(counter)) == 4 * per_line  # the refused job reserved nothing
        await harness.api.cancel(tenant, first.spec.id)
        for _ in range(5):
            await harness.driver.drive(first.spec.id)
            harness.clock.advance(1000)
        assert (await harness.job(first.spec.id)).status == jobs.CANCELLED
        assert int(await redis.get(counter)) == 0  # the ended job's ledger is gone, and so is its reservation
        second = await harness.create([line(f"c{i}") for i in range(4)], tenant)
        assert second.status == jobs.IN_PROGRESS
    finally:
        await harness.cleanup()
        await redis.delete(counter)
        await redis.aclose()


async def test_an_idempotency_key_reused_for_another_batch_is_refused(harness):
    tenant = Principal(tenant_id=f"idem-{uuid.uuid4().hex[:8]}")
    key = f"k-{uuid.uuid4().hex}"
    bodies = []
    for custom_id in ("a", "b"):
        record = await harness.api_files.upload(tenant, "in.jsonl", "batch", _Source(line(custom_id).encode()))
        bodies.append(json.dumps({"input_file_id": record.id, "endpoint": "/v1/completions"}).encode())
    first = await harness.api.create(tenant, bodies[0], key)
    harness.created.append(first.spec.id)
    with pytest.raises(ApiError) as reused:
        await harness.api.create(tenant, bodies[1], key)
    assert (reused.value.status, reused.value.code, reused.value.param) == (
        422,
        "idempotency_key_reused",
        constants.HTTP_IDEMPOTENCY_KEY,
    )
    assert (await harness.api.create(tenant, bodies[0], key)).spec.id == first.spec.id


async def test_files_list_filters_by_purpose_across_pages_and_orders_both_ways(harness):
    """Right after a batch is created its output and error files are the tenant's newest: a page of purpose=batch
    still lists the uploads behind them (it answered empty with has_more), and order=asc lists oldest first."""
    who = Principal(tenant_id=f"lister-{uuid.uuid4().hex[:8]}")
    uploads = []
    for i in range(12):
        uploads.append((await harness.api_files.upload(who, f"{i}.jsonl", "batch", _Source(line("a").encode()))).id)
        harness.clock.advance(1000)
    job = await harness.create([line("a")], principal=who)
    uploads.append(job.spec.input_file_id)
    page, has_more = await harness.api_files.list_files(who, "batch", None, 2)
    assert [r.id for r in page] == uploads[::-1][:2] and has_more
    listed, after = [], None
    while True:
        page, has_more = await harness.api_files.list_files(who, "batch", after, 5)
        listed += [r.id for r in page]
        if not has_more:
            break
        after = page[-1].id
    assert listed == uploads[::-1]
    oldest, has_more = await harness.api_files.list_files(who, "batch", None, 3, "asc")
    assert [r.id for r in oldest] == uploads[:3] and has_more
    outputs, has_more = await harness.api_files.list_files(who, jobs.FILE_PURPOSE_OUTPUT, None, 10)
    assert {r.id for r in outputs} == {job.spec.output_file_id, job.spec.error_file_id} and not has_more


async def test_an_ended_jobs_output_file_has_its_bytes_and_no_error_file_when_none_failed(harness):
    job = await harness.create([line(f"c{i}", f"prompt {i}") for i in range(3)])
    batch_id = job.spec.id
    while (job := await harness.job(batch_id)).status == jobs.IN_PROGRESS:
        await harness.driver.drive(batch_id)
        for request in harness.producer.take():
            await harness.answer(request)
    assert job.status == jobs.COMPLETED
    output = b"".join([c async for c in await harness.api_files.content(TENANT, job.spec.output_file_id)])
    record = await harness.api_files.get_file(TENANT, job.spec.output_file_id)
    assert record.bytes == len(output) > 0  # it was 0 for every output file
    assert (await harness.store.files.get_file(record.id)).bytes == len(output)  # counted once, kept
    body = render.batch_object(job)
    assert body["output_file_id"] == record.id and body["error_file_id"] is None


async def test_an_ended_job_whose_results_file_is_missing_lists_unsized_and_its_content_is_a_404(harness):
    """make test found GET /v1/files a 500 (FileNotFoundError) while an ended job's results file was not there."""
    job = await harness.create([line("c0", "prompt")])
    while (job := await harness.job(job.spec.id)).status == jobs.IN_PROGRESS:
        await harness.driver.drive(job.spec.id)
        for request in harness.producer.take():
            await harness.answer(request)
    await harness.files.delete(job.spec.results_path)
    listed, _ = await harness.api_files.list_files(TENANT, jobs.FILE_PURPOSE_OUTPUT, None, MAX_FILES_PAGE)
    assert (job.spec.output_file_id, 0) in {(r.id, r.bytes) for r in listed}  # the tenant's other tests' files too
    with pytest.raises(ApiError) as caught:
        await harness.api_files.content(TENANT, job.spec.output_file_id)
    assert caught.value.status == 404


async def test_expiration_policies_run_from_each_files_creation_and_the_sweep_honours_them(harness):
    upload = await harness.api_files.upload(TENANT, "in.jsonl", "batch", _Source(line("a").encode()), 3600)
    assert upload.expires_at == upload.created_at + 3600
    policy = {"anchor": "created_at", "seconds": 3600}
    body = {"input_file_id": upload.id, "endpoint": "/v1/completions", "completion_window": "10m"}
    job = await harness.api.create(TENANT, json.dumps({**body, "output_expires_after": policy}).encode())
    batch_id = job.spec.id
    harness.created.append(batch_id)
    harness.clock.advance(60_000)  # it ends a minute in, well before its window does
    while (job := await harness.job(batch_id)).status == jobs.IN_PROGRESS:
        await harness.driver.drive(batch_id)
        for request in harness.producer.take():
            await harness.answer(request)
    ended_s = job.times[jobs.COMPLETED]
    outputs = [job.spec.output_file_id, job.spec.error_file_id]
    assert [(await harness.store.files.get_file(f)).expires_at for f in outputs] == [ended_s + 3600] * 2
    await harness.driver.sweep_files(ended_s + 3599)
    assert all([await harness.store.files.get_file(f) for f in outputs])
    await harness.driver.sweep_files(ended_s + 3600)
    assert [await harness.store.files.get_file(f) for f in [*outputs, upload.id]] == [None] * 3
    assert not await harness.files.exists(job.spec.results_path) and not await harness.files.exists(upload.path)

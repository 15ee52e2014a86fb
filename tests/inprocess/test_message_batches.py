"""Anthropic's Message Batches against the suite's real Kafka and Redis, through the official SDK (anthropic 2.15,
sync, as seed 000 uses it): two API pods served by uvicorn (one with the default 24 h ``expires_at``, one whose
batches expire after a second and whose ``results_url`` names its public base URL, localhost) on the job engine of
``/v1/batches``: the result-router's JobDriver and JobLedger, in this process, drive this test's batches; a fake
worker answers each line it produces (its prompt replayed) except those whose prompt is ``silent``.

Seed 000's ``submit`` and ``reconcile`` run as the seed prints them (:data:`SEED`), changed only in the client's
base_url and api_key, the model, the cutoff and the poll sleep (:func:`seed`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import anthropic
import httpx
import pytest
from anthropic.types.messages import DeletedMessageBatch, MessageBatch, MessageBatchIndividualResponse
from pydantic import BaseModel
from redis.asyncio import Redis
from typer.testing import CliRunner

from llmq_api.pod import Pod
from llmq_cli.main import app
from llmq_core import constants, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import ANTHROPIC
from llmq_core.labels import DEV_TENANT
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.filestore import FileStore
from llmq_jobs.store import JobStore
from llmq_result_router.jobs import JobDriver, JobLedger
from tests import builders
from tests.fake_results import fake_result
from tests.inprocess.test_api import free_port, serving

pytestmark = pytest.mark.integration

API_KEY = "llmq-dev-key"
VERSION = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
SEED_TIMEOUT_S = 120  # each seed run in a thread; a cold, loaded machine takes seconds

# Seed 000's batch loop, as the seed prints it (its code block, verbatim).
SEED = """
import time
import anthropic

client = anthropic.Anthropic()
CUTOFF = 4 * 3600          # seconds after submission; our deadline, not the provider's
PROMPT_VERSION = "v3"

def custom_id(claim_id: str, run_date: str) -> str:
    return f"claim-{claim_id}-{PROMPT_VERSION}-{run_date}"   # <= 64 chars, [A-Za-z0-9_-]

def submit(claims: list[dict], run_date: str, ledger) -> str:
    requests = [
        {
            "custom_id": custom_id(c["id"], run_date),
            "params": {
                "model": "claude-sonnet-5-5",
                "max_tokens": 800,
                "system": c["system_prompt"],
                "messages": [{"role": "user", "content": c["claim_text"]}],
            },
        }
        for c in claims
    ]
    batch = client.messages.batches.create(requests=requests)
    ledger.record_batch(batch.id, [r["custom_id"] for r in requests])  # before anything else
    return batch.id

def reconcile(batch_id: str, started: float, ledger) -> None:
    while time.time() - started < CUTOFF:
        if client.messages.batches.retrieve(batch_id).processing_status == "ended":
            break
        time.sleep(60)
    else:
        client.messages.batches.cancel(batch_id)       # leftovers go to the sync path
    for entry in client.messages.batches.results(batch_id):
        kind = entry.result.type
        if kind == "succeeded":
            ledger.upsert_summary(entry.custom_id, entry.result.message)
        elif kind == "errored":
            ledger.mark_error(entry.custom_id, entry.result.error)  # split by error type
        else:                                           # expired or canceled
            ledger.mark_pending(entry.custom_id)
"""
# What the test changes in it, each exactly once: the client, the model, the cutoff, the poll sleep.
CHANGES = {
    "client = anthropic.Anthropic()": "client = anthropic.Anthropic(base_url=BASE_URL, api_key=API_KEY)",
    '"claude-sonnet-5-5"': '"llmq-sim"',
    "CUTOFF = 4 * 3600": "CUTOFF = CUTOFF_S",
    "time.sleep(60)": "time.sleep(POLL_S)",
}


def seed(base_url: str, cutoff_s: float, poll_s: float = 0.05) -> dict:
    """The seed's functions (``submit``, ``reconcile``) with only :data:`CHANGES` made."""
    code = SEED
    for old, new in CHANGES.items():
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    namespace = {"BASE_URL": base_url, "API_KEY": API_KEY, "CUTOFF_S": cutoff_s, "POLL_S": poll_s}
    exec(compile(code, "seed_000", "exec"), namespace)  # noqa: S102 (the seed's own code, as printed)
    return namespace


class Ledger:
    """The seed's ledger: each custom_id's state (recorded, summary, error, pending) and what it got."""

    def __init__(self) -> None:
        self.batches: dict[str, list[str]] = {}
        self.state: dict[str, str] = {}
        self.got: dict[str, object] = {}

    def record_batch(self, batch_id: str, custom_ids: list[str]) -> None:
        self.batches[batch_id] = custom_ids
        self.state.update(dict.fromkeys(custom_ids, "recorded"))

    def upsert_summary(self, custom_id: str, message) -> None:
        self.state[custom_id], self.got[custom_id] = "summary", message

    def mark_error(self, custom_id: str, error) -> None:
        self.state[custom_id], self.got[custom_id] = "error", error

    def mark_pending(self, custom_id: str) -> None:
        self.state[custom_id] = "pending"


class Engine:
    """The job engine of this test's batches: a JobDriver stepping them (this tenant's Message Batches alone, so no
    other test's job is touched) and a fake worker answering what it produces through the JobLedger."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.store = JobStore(redis)
        self.driver = JobDriver(settings, self.store, FileStore(settings.jobs.files_url), self, redis, SYSTEM_CLOCK)
        self.ledger = JobLedger(settings, self.store, self, SYSTEM_CLOCK)
        self.produced: list[wire.GenerationRequest] = []
        self.tick_s = settings.jobs.batch_tick_ms / 1000

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        """The driver's (and ledger's) producer: a request line goes to the fake worker."""
        if topic == constants.requests_topic(constants.DEFERRED):
            self.produced.append(wire.decode(value))

    async def run(self) -> None:
        while True:
            batches, _ = await self.store.jobs.list_jobs(DEV_TENANT, None, 100, ANTHROPIC)
            for job in batches:
                if job.status in jobs.ACTIVE_STATUSES:
                    await self.driver.drive(job.spec.id)
            produced, self.produced = self.produced, []
            for request in produced:
                prompt = request.messages[-1].content
                if prompt != "silent":
                    text = prompt[: request.sampling.max_tokens]
                    await self.ledger.on_result(fake_result(request, wire.Outcome.SUCCEEDED, text))
            await asyncio.sleep(self.tick_s)


def _pod(settings: Settings) -> Pod:
    instance_id = f"api-batches-{uuid.uuid4().hex[:8]}"
    pod = Pod(settings, instance_id, names=Names(saturation_key=f"apitest-saturation-{instance_id}"))
    pod.catalog.observe(
        builders.heartbeat(
            "llmq-sim",
            worker_id=f"apitest-{uuid.uuid4().hex[:6]}",
            max_slots=0,
            sent_ms=int(time.time() * 1000),
            context_window=8192,
        )
    )
    return pod


@pytest.fixture(scope="module")
async def pods():
    """(base URL of the 24 h pod, base URL of the pod whose batches expire in 1 s, the engine's store)."""
    jobs_settings = {"files_url": f"memory://message-batches-{uuid.uuid4().hex}", "batch_end_grace_ms": 0}
    jobs_settings |= {"batch_tick_ms": 50}
    settings = Settings(jobs=jobs_settings)
    port = free_port()  # the short pod's public base URL names it as localhost, its requests' Host is 127.0.0.1
    public_url = f"http://localhost:{port}/"
    short = Settings(jobs={**jobs_settings, "message_batch_expiry_s": 1}, api={"public_base_url": public_url})
    redis = Redis.from_url(settings.redis.url)
    engine = Engine(settings, redis)
    running = asyncio.create_task(engine.run())
    try:
        async with serving(_pod(settings)) as base_url, serving(_pod(short), port=port) as short_url:
            yield base_url, short_url, engine.store
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await redis.aclose()


def claims(prefix: str, texts: list[str], system="Summarise the claim.") -> list[dict]:
    return [{"id": f"{prefix}{i}", "system_prompt": system, "claim_text": t} for i, t in enumerate(texts)]


async def test_seed_000_submit_and_reconcile_as_printed(pods):
    """Succeeded and errored (a bad request: an image block as the system prompt) in one batch, canceled at the
    cutoff in another, expired (a 1 s expires_at) in a third; every custom_id lands in the seed's right state."""
    base_url, short_url, _ = pods
    run_date = uuid.uuid4().hex[:8]
    good = claims("g", ["water damage", "theft", "hail"])
    bad = claims("b", ["fire"], system=[{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}])
    ledger = Ledger()

    def nightly(url: str, cutoff_s: float, batch_claims: list[dict]) -> str:
        loop = seed(url, cutoff_s)
        started = time.time()
        batch_id = loop["submit"](batch_claims, run_date, ledger)
        loop["reconcile"](batch_id, started, ledger)
        return batch_id

    done = await asyncio.wait_for(
        asyncio.gather(
            asyncio.to_thread(nightly, base_url, SEED_TIMEOUT_S, good + bad),
            asyncio.to_thread(nightly, base_url, 0, claims("c", ["silent", "silent"])),  # cancelled at the cutoff
            asyncio.to_thread(nightly, short_url, SEED_TIMEOUT_S, claims("x", ["silent"])),  # expires
        ),
        SEED_TIMEOUT_S,
    )
    ids = {c: f"claim-{c}-v3-{run_date}" for c in ("g0", "g1", "g2", "b0", "c0", "c1", "x0")}
    assert ledger.state == {
        **{ids[c]: "summary" for c in ("g0", "g1", "g2")},
        ids["b0"]: "error",
        **{ids[c]: "pending" for c in ("c0", "c1", "x0")},
    }
    assert [ledger.got[ids[f"g{i}"]].content[0].text for i in range(3)] == ["water damage", "theft", "hail"]
    assert ledger.got[ids["g0"]].usage.service_tier == "batch"
    error = ledger.got[ids["b0"]]
    assert error.error.type == "invalid_request_error" and "system" in error.error.message
    client = Batches(base_url)
    kinds = {}
    for batch_id in done:
        kinds |= {entry.custom_id: entry.result.type for entry in await client.results(batch_id)}
    assert [kinds[ids[c]] for c in ("c0", "c1", "x0")] == ["canceled", "canceled", "expired"]
    canceled = await client.retrieve(done[1])
    assert canceled.request_counts.canceled == 2 and canceled.cancel_initiated_at is not None
    assert canceled.processing_status == "ended" and canceled.ended_at >= canceled.cancel_initiated_at


class Batches:
    """The sync SDK's ``client.messages.batches``, each call run in a thread (the pods serve on the test's event
    loop); ``results`` read whole there."""

    def __init__(self, base_url: str) -> None:
        self._batches = anthropic.Anthropic(base_url=base_url, api_key=API_KEY, max_retries=0).messages.batches

    def __getattr__(self, name: str):
        method = getattr(self._batches, name)

        async def call(*args, **kwargs):
            return await asyncio.to_thread(lambda: _whole(name, method(*args, **kwargs)))

        return call


def _whole(name: str, answer):
    return list(answer) if name == "results" else answer


def strict(model: type[BaseModel], raw: bytes | str):
    """``raw`` as the SDK's ``model``, strictly (JSON types as declared), with no key the model lacks at any depth."""
    parsed = model.model_validate_json(raw, strict=True)
    pending = [parsed]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseModel):
            assert not item.model_extra, f"{type(item).__name__} has keys the SDK lacks: {item.model_extra}"
            pending += [getattr(item, name) for name in type(item).model_fields]
        elif isinstance(item, list):
            pending += item
    return parsed


def request(custom_id: str, content: str = "hello", **params) -> dict:
    params = {"model": "llmq-sim", "max_tokens": 5, "messages": [{"role": "user", "content": content}], **params}
    return {"custom_id": custom_id, "params": params}


async def test_the_sdk_creates_retrieves_lists_cancels_reads_and_deletes(pods):
    base_url, short_url, store = pods
    async with httpx.AsyncClient(base_url=base_url, headers=VERSION, timeout=60) as http:
        created = await http.post("/v1/messages/batches", json={"requests": [request("a"), request("b", "silent")]})
        assert created.status_code == 200, created.text
        batch = strict(MessageBatch, created.content)
        assert batch.processing_status == "in_progress" and batch.results_url is None
        assert (batch.expires_at - batch.created_at).total_seconds() == pytest.approx(86_400, abs=1)
        assert (
            await http.get(f"/v1/batches/{batch.id}", headers={"authorization": f"Bearer {API_KEY}"})
        ).status_code == 404
        refused = await http.delete(f"/v1/messages/batches/{batch.id}")
        assert refused.status_code == 400 and "only an ended batch" in refused.json()["error"]["message"]
        canceled = strict(MessageBatch, (await http.post(f"/v1/messages/batches/{batch.id}/cancel")).content)
        assert canceled.processing_status in ("canceling", "ended") and canceled.results_url.startswith(base_url)
        lines = (await http.get(f"/v1/messages/batches/{batch.id}/results")).text.splitlines()
        results = {r.custom_id: r.result for r in (strict(MessageBatchIndividualResponse, line) for line in lines)}
        assert results["a"].type in ("succeeded", "canceled") and results["b"].type == "canceled"
        ended = strict(MessageBatch, (await http.get(f"/v1/messages/batches/{batch.id}")).content)
        assert ended.processing_status == "ended" and sum(ended.request_counts.model_dump().values()) == 2
        deleted = await http.delete(f"/v1/messages/batches/{batch.id}")
        assert strict(DeletedMessageBatch, deleted.content).id == batch.id
        assert (await http.get(f"/v1/messages/batches/{batch.id}")).json()["error"]["type"] == "not_found_error"
        assert (await http.get(f"/v1/messages/batches/{batch.id}/results")).status_code == 404
        assert await store.jobs.get_job(batch.id) is None

    client = Batches(short_url)
    made = [await client.create(requests=[request(f"r{i}")]) for i in range(3)]
    assert made[0].expires_at.timestamp() - made[0].created_at.timestamp() == pytest.approx(1, abs=0.01)
    newest_first = [b.id for b in sorted(made, key=lambda b: (b.created_at, b.id), reverse=True)]  # the listing's order
    page = await client.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more and page.last_id == newest_first[1]
    older = await client.list(limit=2, after_id=newest_first[0])
    assert [b.id for b in older.data] == newest_first[1:3]
    newer = await client.list(limit=1, before_id=newest_first[2])
    assert [b.id for b in newer.data] == [newest_first[1]] and newer.has_more
    while (retrieved := await client.retrieve(made[0].id)).processing_status != "ended":
        await asyncio.sleep(0.05)
    public_url = short_url.replace("127.0.0.1", "localhost")
    assert retrieved.results_url == f"{public_url}/v1/messages/batches/{made[0].id}/results"
    assert [e.result.type for e in await client.results(made[0].id)] in (["succeeded"], ["expired"])


@pytest.mark.parametrize(
    ("requests", "param"),
    [
        ([request("a b")], "requests[0].custom_id"),
        ([request("x" * 65)], "requests[0].custom_id"),
        ([request("same"), request("ok"), request("same")], "requests[2].custom_id"),
        ([{"custom_id": "p"}], "requests[0].params"),
        ([], "requests"),
    ],
)
async def test_a_bad_custom_id_or_shape_refuses_the_whole_create(pods, requests, param):
    base_url, _, store = pods
    newest = [job.spec.id for job in (await store.jobs.list_jobs(DEV_TENANT, None, 1, ANTHROPIC))[0]]
    async with httpx.AsyncClient(base_url=base_url, headers=VERSION, timeout=60) as http:
        response = await http.post("/v1/messages/batches", json={"requests": requests})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}:")
    after = [job.spec.id for job in (await store.jobs.list_jobs(DEV_TENANT, None, 1, ANTHROPIC))[0]]
    assert after == newest  # nothing was created (the newest batch is the one before)


async def test_bad_params_are_accepted_and_end_errored(pods):
    base_url, _, _ = pods
    client = Batches(base_url)
    batch = await client.create(
        requests=[
            request("no-model", model="not-served"),
            request("hot", temperature=7),
            {"custom_id": "no-max", "params": {"model": "llmq-sim", "messages": [{"role": "user", "content": "x"}]}},
            request("fine"),
        ]
    )
    while (batch := await client.retrieve(batch.id)).processing_status != "ended":
        await asyncio.sleep(0.05)
    assert batch.request_counts.errored == 3 and batch.request_counts.succeeded == 1
    results = {e.custom_id: e.result for e in await client.results(batch.id)}
    errors = {c: r.error.error for c, r in results.items() if r.type == "errored"}
    assert errors["no-model"].type == "not_found_error"
    assert errors["hot"].type == errors["no-max"].type == "invalid_request_error"
    assert "temperature" in errors["hot"].message and "max_tokens" in errors["no-max"].message
    assert results["fine"].message.content[0].text == "hello" and results["fine"].message.stop_reason == "max_tokens"


async def test_llmq_batch_run_drives_message_batches(pods, tmp_path):
    """``llmq batch run --format anthropic``: shards of a /v1/messages job run as Message Batches; a bad request is
    dead-lettered (not retried), the rest joined in job order; run again, the job resumes from its manifest."""
    base_url, _, _ = pods
    job = tmp_path / "job.jsonl"
    lines = [
        {"custom_id": f"j{i}", "url": "/v1/messages", "body": request(f"j{i}", f"text {i}")["params"]} for i in range(5)
    ]
    lines.append({"custom_id": "bad", "url": "/v1/messages", "body": request("bad", model="not-served")["params"]})
    job.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    args = ["batch", "run", str(job), "-o", str(out), "--format", "anthropic", "--shard-max-requests", "2"]
    args += ["--poll-interval-s", "0.05", "--base-url", f"{base_url}/v1", "--json"]
    for _ in range(2):
        done = await asyncio.to_thread(CliRunner().invoke, app, args)
        assert done.exit_code == 1, done.output  # the bad request is dead-lettered
        report = json.loads(done.output)
        assert (report["accepted"], report["dead_lettered"]) == (5, 1), report
        assert report["dead_letter_reasons"] == {"not_found_error": 1}
    joined = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["custom_id"] for x in joined] == [*(f"j{i}" for i in range(5)), "bad"]
    assert {x["result"]["message"]["content"][0]["text"] for x in joined[:5]} == {"text "}
    assert joined[5]["error"]["code"] == "not_found_error" and joined[5]["error"]["dead_letter"]

"""Tenant limits bound cost (issue 12 items 5 and 6), against a real API pod on the real Kafka and Redis.

Generation requests are charged their estimate at admission and settled with their real usage (the buckets are read
in Redis; the pod's clock is frozen, so no refill blurs the levels); files, batches and batch lines no longer bypass
the limits; the file storage quota; uploads need the deferred class; batch create streams its input: a real API pod
process stays within 50 MB of its idle RSS across three concurrent creates of a 100 MB file.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from redis.asyncio import Redis

from llmq_api.auth import KeyEntry, KeyStore
from llmq_api.pod import Pod
from llmq_api.ratelimit import DAY_MS, MINUTE_MS
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_core.tokenizer import count_tokens, render_chat
from tests import builders
from tests.inprocess.test_api import FakeWorker, pod_process, serving
from tests.stacks import RATE_LIMIT_TIMEOUT_MS

pytestmark = pytest.mark.integration

MODEL = f"quotatest-{uuid.uuid4().hex[:8]}"
RUN = uuid.uuid4().hex[:8]
CAPPED = KeyEntry(
    tenant=f"capped-{RUN}",
    key=f"k-capped-{RUN}",
    requests_per_min=1000,
    tokens_per_min=1000,
    batch_tokens_per_day=2000,
    file_storage_bytes=4000,
)
FEW_CALLS = KeyEntry(tenant=f"few-{RUN}", key=f"k-few-{RUN}", requests_per_min=2)
NO_DEFERRED = KeyEntry(tenant=f"live-{RUN}", key=f"k-live-{RUN}", classes=["interactive"])


def heartbeat(model: str) -> wire.WorkerHeartbeat:
    """Teaches the catalog a model of unknown context window (0), without inviting any batch."""
    return builders.heartbeat(model, worker_id=f"quotatest-{RUN}", max_slots=0, sent_ms=int(time.time() * 1000))


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    """(base_url, redis, pod): one pod with a frozen clock and the keys above, answered by test_api's fake worker."""
    settings = Settings(
        jobs={"files_url": str(tmp_path_factory.mktemp("quota-files"))},
        api={"rate_limit_timeout_ms": RATE_LIMIT_TIMEOUT_MS},
    )
    instance_id = f"api-quota-{RUN}"
    keys = KeyStore({})
    keys.add([CAPPED, FEW_CALLS, NO_DEFERRED])
    pod = Pod(
        settings,
        instance_id,
        clock=FakeClock(int(time.time() * 1000)),
        keys=keys,
        names=Names(saturation_key=f"quotatest-saturation-{instance_id}"),
    )
    pod.catalog.observe(heartbeat(MODEL))
    worker = FakeWorker(settings, instance_id)
    await worker.start()
    redis = Redis.from_url(settings.redis.url)
    try:
        async with serving(pod) as base_url:
            yield base_url, redis, pod
    finally:
        await _forget_jobs(redis, [CAPPED.tenant, FEW_CALLS.tenant])
        await worker.stop()
        await redis.aclose()


@pytest.fixture
async def capped(stack):
    """A fresh start for the capped tenant: full buckets, no files."""
    base_url, redis, pod = stack
    await redis.delete(*(constants.ratelimit_key(CAPPED.tenant, b) for b in ("requests", "tokens", "batch_tokens")))
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=auth(CAPPED)) as client:
        for record in (await client.get("/v1/files")).json()["data"]:
            await client.delete(f"/v1/files/{record['id']}")
    return base_url, redis, pod


def auth(entry: KeyEntry) -> dict:
    return {"authorization": f"Bearer {entry.key}"}


def sdk(base_url: str, entry: KeyEntry = CAPPED) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=entry.key, max_retries=0, timeout=30)


async def tokens_left(redis: Redis, tenant: str, bucket: str = "tokens") -> float | None:
    """What the bucket holds (None: no key, a full bucket)."""
    level = await redis.hget(constants.ratelimit_key(tenant, bucket), "level")
    return None if level is None else int(level) / (DAY_MS if bucket == "batch_tokens" else MINUTE_MS)


async def test_a_request_whose_estimate_exceeds_the_bucket_is_refused_with_a_400(capped):
    base_url, redis, _ = capped
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(base_url).completions.create(model=MODEL, prompt="x", max_tokens=8000, n=100)
    error = refused.value.body
    assert (error["code"], error["param"]) == ("tokens_exceed_limit", "max_tokens")
    assert "800001" in error["message"] and "1000" in error["message"] and "not a 429" in error["message"]
    assert await redis.exists(constants.ratelimit_key(CAPPED.tenant, "tokens")) == 0  # nothing was taken


async def test_a_request_is_charged_its_estimate_and_refunded_to_its_usage(capped):
    base_url, redis, _ = capped
    prompt = "slow:1500 abcd"  # held by the fake worker for 1.5 s: long enough to read the charge mid-flight
    call = asyncio.create_task(sdk(base_url).completions.create(model=MODEL, prompt=prompt, max_tokens=100, n=4))
    estimate = len(prompt) + 4 * 100
    await _eventually(lambda: tokens_left(redis, CAPPED.tenant), lambda left: left == 1000 - estimate)
    completion = await call
    used = completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert used == len(prompt) + 100  # the fake worker answers one choice of max_tokens
    await _eventually(lambda: tokens_left(redis, CAPPED.tenant), lambda left: left == 1000 - used)


async def test_a_deadline_and_a_client_that_leaves_keep_their_estimate_and_settle_once(capped):
    base_url, redis, pod = capped
    body = {"model": MODEL, "prompt": "silent", "max_tokens": 50}
    async with httpx.AsyncClient(base_url=base_url, headers=auth(CAPPED)) as client:
        response = await client.post("/v1/completions", json=body, headers={"x-llmq-timeout-ms": "300"}, timeout=10)
        assert response.status_code == 504
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=body, timeout=0.5)
    estimate = len("silent") + 50
    await _eventually(lambda: asyncio.sleep(0, len(pod.registry)), lambda waiting: waiting == 0)  # both resolved
    await pod.limiter.drain()  # their settlements ran
    assert await tokens_left(redis, CAPPED.tenant) == 1000 - 2 * estimate


async def test_an_idempotent_replay_is_not_charged_twice(capped):
    base_url, redis, _ = capped
    headers = {**auth(CAPPED), "idempotency-key": f"order-{uuid.uuid4().hex}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 10}
        first = await client.post("/v1/completions", json=body)
        await _store_result(redis, first)  # the result-router's part: no router runs here
        again = await client.post("/v1/completions", json=body)
    assert first.status_code == again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    await _eventually(lambda: tokens_left(redis, CAPPED.tenant), lambda left: left == 1000 - 13)


async def test_batch_lines_draw_from_the_batch_quota_and_a_batch_that_cannot_fit_is_refused(capped):
    base_url, redis, _ = capped
    client = sdk(base_url)
    first = await upload(client, [chat_line(f"s{i}", max_tokens=400) for i in range(3)])
    batch = await client.batches.create(input_file_id=first, endpoint="/v1/chat/completions", completion_window="1h")
    assert batch.status == "in_progress"
    estimate = 3 * (400 + _chat_prompt_tokens("hi"))
    assert await tokens_left(redis, CAPPED.tenant, "batch_tokens") == pytest.approx(2000 - estimate)
    large = await upload(client, [chat_line(f"l{i}", max_tokens=700) for i in range(3)])
    with pytest.raises(openai.BadRequestError) as refused:
        await client.batches.create(input_file_id=large, endpoint="/v1/chat/completions", completion_window="1h")
    assert refused.value.body["code"] == "batch_tokens_exceed_quota" and "2000" in refused.value.body["message"]
    again = await upload(client, [chat_line(f"a{i}", max_tokens=300) for i in range(3)])
    with pytest.raises(openai.RateLimitError) as short:  # fits the quota, not what is left of it today
        await client.batches.create(input_file_id=again, endpoint="/v1/chat/completions", completion_window="1h")
    assert int(short.value.response.headers["retry-after"]) > 60


async def test_files_and_batches_take_from_the_requests_bucket(stack):
    base_url, _, _ = stack
    client = sdk(base_url, FEW_CALLS)
    file_id = await upload(client, [chat_line("a")])
    await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.RateLimitError) as refused:
        await upload(client, [chat_line("b")])
    assert refused.value.body["type"] == "requests"


async def test_the_storage_quota_bounds_a_tenants_live_files(capped):
    base_url, redis, _ = capped
    client = sdk(base_url)
    first = await client.files.create(file=("a.jsonl", b"x" * 3000), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("b.jsonl", b"y" * 2000), purpose="batch")
    error = refused.value.body
    assert error["code"] == "storage_quota_exceeded" and "4000 bytes" in error["message"]
    assert int(await redis.get(constants.tenant_storage_key(CAPPED.tenant))) == 3000
    await client.files.delete(first.id)
    assert int(await redis.get(constants.tenant_storage_key(CAPPED.tenant))) == 0
    await client.files.create(file=("b.jsonl", b"y" * 2000), purpose="batch")


async def test_uploads_need_a_key_that_may_use_the_deferred_class(stack):
    base_url, _, _ = stack
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await sdk(base_url, NO_DEFERRED).files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    assert refused.value.body["code"] == "class_not_allowed" and "deferred" in refused.value.body["message"]


async def test_batch_create_streams_its_input_and_concurrent_creates_are_limited(tmp_path):
    """A real pod process: three concurrent creates of a 100 MB input keep its RSS within 50 MB of idle; a fourth
    gets 429 with Retry-After."""
    tenant = f"rss-{RUN}"
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"tenant": tenant, "key": f"k-{tenant}"}]}))
    env = {
        "LLMQ_FILES_URL": str(tmp_path / "files"),
        "LLMQ_API_KEYS_FILE": str(keys),
        "LLMQ_BATCH_CREATE_MAX_PER_TENANT": "3",
        "LLMQ_BATCH_CREATE_MAX_PER_POD": "3",
    }
    redis = Redis.from_url(Settings().redis.url)
    try:
        async with (
            pod_process(f"api-rss-{RUN}", tmp_path / "api.log", **env) as (base_url, process),
            httpx.AsyncClient(
                base_url=base_url, timeout=120, headers={"authorization": f"Bearer k-{tenant}"}
            ) as client,
        ):
            big = _input_file(tmp_path / "big.jsonl", 100 << 20)
            lines = sum(1 for _ in big.open("rb"))
            small, big_id = (
                await _upload_path(client, _input_file(tmp_path / "small.jsonl", 1 << 20)),
                await _upload_path(client, big),
            )
            big.unlink()
            assert (await _create(client, small)).json()["status"] == "in_progress"  # warm: every import loaded
            rss = psutil.Process(process.pid)
            idle = rss.memory_info().rss
            prepared_before = _prepared(tmp_path / "files")
            creates = [asyncio.create_task(_create(client, big_id)) for _ in range(3)]
            peak, fourth = idle, None
            while not all(c.done() for c in creates):
                peak = max(peak, rss.memory_info().rss)
                if fourth is None and _prepared(tmp_path / "files") - prepared_before == 3:  # all three validating
                    fourth = await _create(client, big_id)
                await asyncio.sleep(0.02)
            assert fourth is not None and fourth.status_code == 429 and int(fourth.headers["retry-after"]) >= 1
            created = [c.result().json() for c in creates]
            assert [b["request_counts"]["total"] for b in created] == [lines] * 3, created
            assert peak - idle < 50 << 20, f"RSS grew by {(peak - idle) >> 20} MB"
    finally:
        await _forget_jobs(redis, [tenant])
        await redis.aclose()
        shutil.rmtree(tmp_path / "files", ignore_errors=True)  # ~400 MB: the upload and three prepared files


# --- helpers ------------------------------------------------------------------------------------------------------


def chat_line(custom_id: str, max_tokens: int = 8, content: str = "hi") -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]},
    }


def _chat_prompt_tokens(content: str) -> int:
    return count_tokens(render_chat([wire.ChatMessage(role="user", content=content)]))


async def _store_result(redis: Redis, response: httpx.Response) -> None:
    """Store a completion's result as the result-router would, for idempotent replays to find."""
    body, request_id = response.json(), response.headers[constants.HTTP_REQUEST_ID]
    usage = body["usage"]
    result = wire.FinalResult(
        request_id=request_id,
        outcome=wire.Outcome.SUCCEEDED,
        model=body["model"],
        tenant_id=CAPPED.tenant,
        endpoint="completions",
        reply_to=wire.HttpReply(instance_id=""),
        choices=[wire.Choice(index=0, text=body["choices"][0]["text"], finish_reason="length")],
        usage=wire.Usage(
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            total_tokens=usage["total_tokens"],
        ),
    )
    await redis.set(constants.result_key(request_id), wire.encode(result), ex=60)


async def upload(client: openai.AsyncOpenAI, lines: list[dict]) -> str:
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return (await client.files.create(file=("input.jsonl", data), purpose="batch")).id


def _input_file(path: Path, size_bytes: int) -> Path:
    """A valid batch input of about ``size_bytes``: lines of ~4 KiB prompts for llmq-sim."""
    lines = size_bytes // 4200
    with path.open("w") as out:
        for i in range(lines):
            line = {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "llmq-sim", "prompt": f"{i} " + "p" * 4096, "max_tokens": 4},
            }
            out.write(json.dumps(line) + "\n")
    return path


async def _upload_path(client: httpx.AsyncClient, path: Path) -> str:
    with path.open("rb") as data:
        response = await client.post("/v1/files", files={"file": (path.name, data)}, data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


async def _create(client: httpx.AsyncClient, file_id: str) -> httpx.Response:
    return await client.post(
        "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "1h"}
    )


def _prepared(files_dir: Path) -> int:
    """Prepared files of jobs: one appears as a create begins to validate."""
    return sum(1 for _ in (files_dir / "jobs").glob("*/requests.jsonl"))


async def _forget_jobs(redis: Redis, tenants: list[str]) -> None:
    """Take this test's jobs out of the set the result-routers drive, so no later stack runs them."""
    for tenant in tenants:
        for member in await redis.zrange(constants.tenant_jobs_key(tenant), 0, -1):
            batch_id = member.decode().split(":", 1)[1]
            await redis.srem(constants.ACTIVE_JOBS_KEY, batch_id)
            await redis.delete(
                constants.job_key(batch_id),
                constants.job_lines_key(batch_id),
                constants.job_offsets_key(batch_id),
                constants.job_results_key(batch_id),
            )


async def _eventually(read, check, timeout_s: float = 10):
    deadline = time.monotonic() + timeout_s
    while not check(value := await read()):
        assert time.monotonic() < deadline, f"last value {value}"
        await asyncio.sleep(0.02)

"""Redis with a memory budget, against private redis-servers with a tiny ``maxmemory``: eviction takes only keys
with a TTL (stored results, claims), never a batch job's ledger; a tenant's stored results stay within its bound,
its oldest dropped first; an API pod whose Redis refuses writes answers 503 + Retry-After, never 500, and queues
nothing it did not answer for."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import uuid

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from llmq_api.app import create_app
from llmq_api.auth import KeyStore, Principal
from llmq_api.errors import STORE_FULL_RETRY_AFTER_S
from llmq_api.pod import Pod
from llmq_cli.devstack import redis_server_argv
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.redis_client import MEMORY_POLICY, check_memory_policy
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.jobs import JobSpec
from llmq_jobs.store import JobStore
from llmq_result_router.store import ResultStore
from tests.builders import job_spec
from tests.stacks import RATE_LIMIT_TIMEOUT_MS

pytestmark = pytest.mark.integration

MIB = 1 << 20
TTL_MS = 3_600_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def private_redis(tmp_path, maxmemory_bytes: int, policy: str):
    """A redis-server of our own on a free port (no persistence); yields a client, stops the server after."""
    port = _free_port()
    argv = redis_server_argv(port, tmp_path, maxmemory_bytes, policy)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = Redis(port=port, socket_timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                await client.ping()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                await asyncio.sleep(0.05)
        yield client
    finally:
        await client.aclose()
        proc.terminate()
        proc.wait(10)


def _spec(batch_id: str, lines: int) -> JobSpec:
    return job_spec(
        batch_id, tenant_id="jobs-tenant", input_file_id="file-x", expires_ms=2**42, total=lines, runnable=lines
    )


def _result(request_id: str, tenant_id: str, text_bytes: int) -> bytes:
    return wire.encode(
        wire.FinalResult(
            request_id=request_id,
            tenant_id=tenant_id,
            outcome=wire.Outcome.SUCCEEDED,
            model="llmq-sim",
            reply_to=wire.HttpReply(instance_id="pod"),
            choices=[wire.Choice(index=0, text="x" * text_bytes)],
        )
    )


async def test_filling_redis_with_results_evicts_only_keys_with_a_ttl_and_a_ledger_survives(tmp_path):
    async with private_redis(tmp_path, 4 * MIB, MEMORY_POLICY) as redis:
        store, batch_id = JobStore(redis), "batch_memory"
        lines = {f"line-{i}": jobs.pending(0) for i in range(500)}
        await store.jobs.create_job(_spec(batch_id, len(lines)), jobs.IN_PROGRESS, {}, files=(), lines=lines)
        results = ResultStore(redis, TTL_MS, max_bytes=64 * MIB, max_results=100_000)
        written = 0
        for i in range(600):  # ~12 MB of results, 3x the budget, from 30 tenants (none reaches its own bound)
            stored = await results.put(f"tenant-{i % 30}", f"req-{i}", _result(f"req-{i}", f"tenant-{i % 30}", 20_000))
            assert stored.kept and stored.dropped == 0
            written += 1
        info = await redis.info()
        assert info["evicted_keys"] > 0 and info["used_memory"] <= 4 * MIB + 64 * 1024  # past it by one write at most
        assert await redis.hgetall(constants.job_lines_key(batch_id)) == {
            k.encode(): v.encode() for k, v in lines.items()
        }
        assert (await store.jobs.get_job(batch_id)).status == jobs.IN_PROGRESS
        kept = [key async for key in redis.scan_iter(match=constants.REDIS_RESULT_PREFIX + "*")]
        assert 0 < len(kept) < written
        async for key in redis.scan_iter():  # whatever lacks a TTL is job state, which eviction may not take
            if await redis.pttl(key) == -1:
                assert key.decode().startswith(constants.REDIS_JOBS_PREFIX), key


async def test_a_tenants_stored_results_stay_within_its_bound_oldest_dropped_first(tmp_path):
    async with private_redis(tmp_path, 64 * MIB, MEMORY_POLICY) as redis:
        clock = FakeClock()
        results = ResultStore(redis, TTL_MS, max_bytes=100_000, max_results=1000, clock=clock)
        sizes = {}
        for i in range(6):  # tenant a: 6 x ~30 KB; the bound holds 3
            value = _result(f"a-{i}", "a", 30_000)
            sizes[f"a-{i}"] = len(value)
            await results.put("a", f"a-{i}", value)
            await results.put("b", f"b-{i}", _result(f"b-{i}", "b", 1_000))
            clock.advance(1_000)
        present = {
            rid for rid in [*sizes, *(f"b-{i}" for i in range(6))] if await redis.exists(constants.result_key(rid))
        }
        assert present == {"a-3", "a-4", "a-5", *(f"b-{i}" for i in range(6))}  # only a's oldest went
        assert int(await redis.get(constants.result_bytes_key("a"))) == sum(sizes[f"a-{i}"] for i in (3, 4, 5))
        assert await redis.zcard(constants.result_index_key("a")) == 3
        again = await results.put("a", "a-5", _result("a-5", "a", 10))  # a redelivery: the first stored wins
        assert not again.first and not again.kept
        assert not (await results.put("a", "huge", _result("huge", "a", 200_000))).kept  # larger than the bound
        clock.advance(TTL_MS)  # every entry so far has expired: the next put forgets them, dropping nothing
        fresh = await results.put("a", "a-new", _result("a-new", "a", 100))
        assert fresh.kept and fresh.dropped == 0 and await redis.zcard(constants.result_index_key("a")) == 1
        assert 0 < await redis.pttl(constants.result_index_key("a")) <= TTL_MS


class RedisWorker:
    """The pod's producer: records what was produced and answers it the way a worker does, over Redis pub/sub."""

    ready = True

    def __init__(self, redis: Redis, instance_id: str) -> None:
        self.redis, self.instance_id = redis, instance_id
        self.produced: list[wire.GenerationRequest] = []

    async def run(self) -> None: ...

    async def stop(self) -> None: ...

    async def produce(self, request: wire.GenerationRequest) -> None:
        self.produced.append(request)
        result = wire.FinalResult(
            request_id=request.request_id,
            tenant_id=request.tenant_id,
            model=request.model,
            outcome=wire.Outcome.SUCCEEDED,
            reply_to=request.reply_to,
            endpoint=request.endpoint,
            choices=[wire.Choice(index=0, text="ok")],
        )
        asyncio.get_running_loop().call_later(
            0.01,
            lambda: asyncio.ensure_future(
                self.redis.publish(constants.replies_channel(self.instance_id), wire.encode(result))
            ),
        )


async def _fill_until_refused(redis: Redis) -> None:
    """Fill Redis with keys that have no TTL until it refuses writes (``noeviction``)."""
    for i in range(100_000):
        try:
            await redis.set(f"fill:{i}", b"x" * 10_000)
        except OutOfMemoryError:
            return
    raise AssertionError("Redis never refused a write")


async def test_an_api_pod_whose_redis_refuses_writes_answers_503_and_queues_nothing(tmp_path, caplog):
    async with private_redis(tmp_path, 3 * MIB, "noeviction") as redis:
        instance_id = f"pod-{uuid.uuid4().hex[:6]}"
        worker = RedisWorker(redis, instance_id)
        keys = KeyStore(
            {
                "open-key": Principal(tenant_id="open"),
                "limited-key": Principal(tenant_id="limited", requests_per_min=1000),
            }
        )
        settings = Settings(
            jobs={"files_url": str(tmp_path / "files")}, api={"rate_limit_timeout_ms": RATE_LIMIT_TIMEOUT_MS}
        )
        pod = Pod(settings, instance_id, producer=worker, keys=keys, redis=redis)
        await pod.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(pod)),
            base_url="http://api",
            headers={"authorization": "Bearer open-key"},
            timeout=10,
        )
        try:
            deadline = time.monotonic() + 10
            while not pod.listener.subscribed:
                assert time.monotonic() < deadline, "the pod never subscribed to its replies channel"
                await asyncio.sleep(0.02)
            await _fill_until_refused(redis)
            body = {"model": "llmq-sim", "prompt": "hello", "max_tokens": 4}
            refusals = [
                await client.post("/v1/completions", json=body, headers={"idempotency-key": "k-1"}),
                await client.post("/v1/completions", json=body, headers={"authorization": "Bearer limited-key"}),
                await client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"}),
            ]
            for response in refusals:
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == str(STORE_FULL_RETRY_AFTER_S)
                assert response.json()["error"]["code"] == "store_unavailable"
            assert worker.produced == []  # nothing queued
            assert not [p for p in (tmp_path / "files").rglob("*") if p.is_file()]  # the refused upload's bytes went
            accepted = await client.post("/v1/completions", json=body)  # needs no write: runs, answered over pub/sub
            assert accepted.status_code == 200 and accepted.json()["choices"][0]["text"] == "ok"
            with caplog.at_level("WARNING"):
                await check_memory_policy(redis, "test")
            assert not [r for r in caplog.records if "maxmemory" in r.getMessage()]  # noeviction with a budget: fine
        finally:
            await client.aclose()
            await pod.stop()


async def test_services_warn_about_a_redis_that_may_grow_or_evict_job_state(tmp_path, caplog):
    async with private_redis(tmp_path, 0, "noeviction") as redis:
        with caplog.at_level("WARNING"):
            await check_memory_policy(redis, "api")
            await redis.config_set("maxmemory", 64 * MIB)
            await redis.config_set("maxmemory-policy", "allkeys-lru")
            await check_memory_policy(redis, "api")
        messages = [r.getMessage() for r in caplog.records]
        assert any("no maxmemory" in m for m in messages) and any("allkeys-lru" in m for m in messages)


async def test_an_ended_job_is_kept_without_a_ttl_until_the_retention_sweep_deletes_it(tmp_path):
    async with private_redis(tmp_path, 64 * MIB, MEMORY_POLICY) as redis:
        store, spec = JobStore(redis), _spec("batch_retired", 1)
        await store.jobs.create_job(spec, jobs.IN_PROGRESS, {}, files=(), lines={"line-0": jobs.pending(0)})
        await store.jobs.retire(spec.id, until_s=1_000)
        assert await redis.pttl(constants.job_key(spec.id)) == -1  # no TTL: volatile-lru can never take it
        assert not await redis.exists(constants.job_lines_key(spec.id))
        assert await store.jobs.expired_jobs(999) == [] and await store.jobs.expired_jobs(1_000) == [spec.id]
        await store.jobs.delete_job(spec.id)
        assert await store.jobs.get_job(spec.id) is None and await store.jobs.expired_jobs(2_000) == []
        assert await redis.zcard(constants.tenant_jobs_key(spec.tenant_id)) == 0

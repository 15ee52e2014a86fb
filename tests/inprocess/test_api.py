"""The API pod against the real Kafka and Redis, served by uvicorn on a free port, with a fake worker inside the test.

The fake worker reads the request topics by manual assignment from their current ends (no consumer group, so the
batcher's group llmq-batcher is untouched), keeps only requests addressed to this test's pod, and answers like
llmq-sim (the prompt replayed) on the pod's Redis channel. Requests use a model only this test's pod knows, so a
running batcher or worker never answers them (a batcher would at most expire them at their deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
import uvicorn
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis
from redis.exceptions import MaxConnectionsError

from llmq_api.app import create_app
from llmq_api.pod import Pod
from llmq_core import constants, wire
from llmq_core.names import Names
from llmq_core.settings import Settings
from tests import builders

pytestmark = pytest.mark.integration

MODEL = f"apitest-{uuid.uuid4().hex[:8]}"
DEV = {"authorization": "Bearer llmq-dev-key"}
READY_TIMEOUT_S = 90  # a cold start imports FastAPI, aiokafka and redis: slow on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def heartbeat(model: str) -> wire.WorkerHeartbeat:
    """A heartbeat with no slots: it teaches the catalog a model without inviting any batch."""
    return builders.heartbeat(
        model,
        worker_id=f"apitest-{uuid.uuid4().hex[:6]}",
        max_slots=0,
        sent_ms=int(time.time() * 1000),
        context_window=512,
    )


class FakeWorker:
    """Answers requests addressed to ``instance_id``: prompt ``silent`` never; ``slow:<ms> ...`` after that delay;
    ``trickle:<ms> ...`` streams its first chunk at once and the rest after that delay."""

    def __init__(self, settings: Settings, instance_id: str) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.redis = Redis.from_url(settings.redis.url)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka.bootstrap_servers, group_id=None, enable_auto_commit=False
        )
        self.seen: dict[str, tuple[wire.GenerationRequest, object]] = {}
        self._task: asyncio.Task | None = None
        self._replies: set[asyncio.Task] = set()

    async def start(self) -> None:
        await self.consumer.start()
        partitions = [
            TopicPartition(topic, p)
            for topic in constants.REQUEST_TOPICS
            for p in range(self.settings.kafka.request_topic_partitions)
        ]
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        for tp in partitions:  # pin the end offsets now, before any request of this test is produced
            await self.consumer.position(tp)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._replies]:
            if task:
                task.cancel()
        await asyncio.gather(self._task, *self._replies, return_exceptions=True)
        await self.consumer.stop()
        await self.redis.aclose()

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    request = wire.decode(record.value, wire.content_type_of(record.headers))
                    if isinstance(request, wire.GenerationRequest) and request.reply_to == wire.HttpReply(
                        instance_id=self.instance_id
                    ):
                        self.seen[request.request_id] = (request, record)
                        task = asyncio.create_task(self._answer(request))
                        self._replies.add(task)
                        task.add_done_callback(self._replies.discard)

    async def _answer(self, request: wire.GenerationRequest) -> None:
        source = request.prompt if request.prompt is not None else request.messages[-1].content
        if source == "silent":
            return
        if source.startswith("slow:"):
            await asyncio.sleep(int(source.split()[0][5:]) / 1000)
        n = request.sampling.max_tokens
        text = (source * n)[:n]
        channel = constants.replies_channel(self.instance_id)
        if request.stream:
            for seq, start in enumerate(range(0, len(text), 2)):
                chunk = wire.TokenChunk(
                    request_id=request.request_id,
                    text=text[start : start + 2],
                    seq=seq,
                    sent_ms=0,
                    tenant_id=request.tenant_id,
                )
                await self.redis.publish(channel, wire.encode(chunk))
                if seq == 0 and source.startswith("trickle:"):
                    await asyncio.sleep(int(source.split()[0][8:]) / 1000)
        result = wire.FinalResult(
            request_id=request.request_id,
            tenant_id=request.tenant_id,
            outcome=wire.Outcome.SUCCEEDED,
            model=request.model,
            endpoint=request.endpoint,
            reply_to=request.reply_to,
            choices=[_choice(request, text)],
            usage=wire.Usage(
                prompt_tokens=request.prompt_tokens, completion_tokens=n, total_tokens=request.prompt_tokens + n
            ),
        )
        await self.redis.publish(channel, wire.encode(result))


def _choice(request: wire.GenerationRequest, text: str) -> wire.Choice:
    """llmq-sim's replay; a request with tools calls its first one instead (as a worker's parsed answer)."""
    if not request.tools:
        return wire.Choice(index=0, text=text, finish_reason="length")
    call = wire.ToolCall(id="call_0", name=request.tools[0].name, arguments='{"city":"Oslo"}')
    return wire.Choice(index=0, text="", finish_reason="stop", tool_calls=[call])


async def wait_ready(base_url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with httpx.AsyncClient(base_url=base_url) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            assert time.monotonic() < deadline, "the API pod did not become ready"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def pod_process(instance_id: str, log_path: Path, **env: str) -> AsyncIterator[tuple[str, subprocess.Popen]]:
    """A real API pod process (``python -m llmq_api.main``) on a free port, its environment this one's plus ``env``,
    ready for the ``with`` block: yields its base URL and the process. Stopped after (killed if it lingers)."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmq_api.main",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--instance-id",
            instance_id,
        ],
        env={**os.environ, **env},
        stderr=log_path.open("wb"),
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url)
        yield base_url, process
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def serving(pod: Pod, wait: bool = True, port: int | None = None, **options):
    """Serve ``pod`` with uvicorn on ``port`` (None: a free one; ``options``: more ``uvicorn.Config`` keywords);
    yields the base URL."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(pod),
            host="127.0.0.1",
            port=port,
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=2,
            **options,
        )
    )
    task = asyncio.create_task(server.serve())
    base_url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            await wait_ready(base_url)
        else:
            while not server.started:
                await asyncio.sleep(0.05)
        yield base_url
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


@pytest.fixture(scope="module")
async def stack():
    """(base_url, pod, fake worker, redis) for this module: one pod serving, one fake worker answering."""
    settings = Settings()
    instance_id = f"api-test-{uuid.uuid4().hex[:8]}"
    pod = Pod(
        settings, instance_id, names=Names(saturation_key=f"apitest-saturation-{instance_id}")
    )  # no batcher's load here
    worker = FakeWorker(settings, instance_id)
    await worker.start()
    redis = Redis.from_url(settings.redis.url)
    async with serving(pod) as base_url:
        yield base_url, pod, worker, redis
    await worker.stop()
    await redis.aclose()


@pytest.fixture
def api(stack):
    base_url, pod, worker, redis = stack
    pod.catalog.observe(heartbeat(MODEL))  # learned in-process only: nothing else hears of this model
    return stack


def sdk(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="llmq-dev-key", max_retries=0, timeout=30)


async def test_completion_through_the_openai_sdk(api):
    base_url, pod, worker, _ = api
    async with sdk(base_url) as client:
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt="abc", max_tokens=5, temperature=0, seed=3
        )
    completion = raw.parse()
    assert completion.choices[0].text == "abcab" and completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == 3 and completion.usage.total_tokens == 8
    assert raw.headers["x-request-id"] == completion.id and completion.id.startswith("cmpl-")
    request, record = worker.seen[completion.id]
    assert record.topic == constants.requests_topic("interactive") and record.key == completion.id.encode()
    assert dict(record.headers)["content-type"] == constants.CONTENT_TYPE_MSGPACK.encode()
    assert request.sampling == wire.SamplingParams(max_tokens=5, temperature=0.0, seed=3)
    assert request.deadline_ms - request.created_ms == pod.settings.api.interactive_default_timeout_ms
    assert completion.id not in pod.registry


async def test_chat_stream_through_the_openai_sdk(api):
    base_url, _, worker, _ = api
    async with sdk(base_url) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-llmq-class": "near_interactive"},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hellohe"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    request, record = worker.seen[chunks[0].id]
    assert request.stream and record.topic == constants.requests_topic("near_interactive")


async def test_stream_chunks_are_written_as_they_arrive(api):
    base_url, _, _, _ = api
    arrivals: list[tuple[float, str]] = []
    async with sdk(base_url) as client:
        stream = await client.completions.create(model=MODEL, prompt="trickle:600 xy", max_tokens=6, stream=True)
        async for chunk in stream:
            arrivals.append((time.monotonic(), chunk.choices[0].text))
    assert "".join(text for _, text in arrivals) == "trickl"
    first_text_s = next(t for t, text in arrivals if text)
    assert arrivals[-1][0] - first_text_s > 0.4, "the first chunk was held back until the end"


def counting_sdk(base_url: str, sent: list[int], on_response=None) -> openai.AsyncOpenAI:
    """The SDK with its default retries; ``sent`` collects each HTTP response's status as the SDK receives it."""

    async def record(response) -> None:
        sent.append(response.status_code)
        if on_response is not None:
            on_response(response)

    http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [record]})
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="llmq-dev-key", timeout=30, http_client=http)


async def test_the_sdk_does_not_retry_a_passed_deadline(api):
    base_url, _, _, _ = api
    sent: list[int] = []
    async with counting_sdk(base_url, sent) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.completions.create(
                model=MODEL, prompt="silent", max_tokens=2, extra_headers={"x-llmq-timeout-ms": "100"}
            )
    assert info.value.status_code == 504 and info.value.response.headers["x-should-retry"] == "false"
    assert sent == [504], "the SDK retried a request whose deadline had passed"


async def test_the_sdk_retries_a_429_after_its_retry_after(api):
    base_url, pod, _, _ = api
    cap = pod.registry.max_waiters
    pod.registry.max_waiters = 0  # the pod is full: 429 + Retry-After, until the first answer went out

    def reopen(response) -> None:
        pod.registry.max_waiters = cap

    sent: list[int] = []
    try:
        async with counting_sdk(base_url, sent, reopen) as client:
            completion = await client.completions.create(model=MODEL, prompt="abc", max_tokens=3)
    finally:
        pod.registry.max_waiters = cap
    assert sent == [429, 200] and completion.choices[0].text == "abc"


async def test_the_sdks_read_timeout_is_a_non_streamed_requests_deadline(api):
    """openai-python sends its read timeout (x-stainless-read-timeout): a non-streamed answer is one read, so it is
    the deadline (capped at the class's maximum), and OpenAI(timeout=120) no longer gets a 504 at the 30 s default;
    a stream's reads are per chunk, so it keeps the class default; x-llmq-timeout-ms wins over both. Every response
    says the class and the timeout applied."""
    base_url, pod, worker, _ = api
    api_settings = pod.settings.api

    async def applied(client, **options) -> tuple[int, dict]:
        raw = await client.completions.with_raw_response.create(model=MODEL, prompt="abc", max_tokens=2, **options)
        completion = raw.parse()
        if options.get("stream"):
            completion = [chunk async for chunk in completion][0]
        request, _ = worker.seen[completion.id]
        assert raw.headers["x-llmq-timeout-ms"] == str(request.deadline_ms - request.created_ms)
        return request.deadline_ms - request.created_ms, raw.headers

    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="llmq-dev-key", max_retries=0, timeout=120
    ) as client:
        timeout_ms, headers = await applied(client)
        assert timeout_ms == 120_000 and headers["x-llmq-class"] == "interactive"
        assert (await applied(client, stream=True))[0] == api_settings.interactive_default_timeout_ms
        assert (await applied(client, extra_headers={"x-llmq-timeout-ms": "5000"}))[0] == 5000
        assert (await applied(client.with_options(timeout=3.5)))[0] == 3500  # a client that gives up sooner
        capped, headers = await applied(
            client.with_options(timeout=86_400), extra_headers={"x-llmq-class": "near_interactive"}
        )
        assert capped == api_settings.near_interactive_max_timeout_ms and headers["x-llmq-class"] == "near_interactive"


async def test_chat_without_max_tokens_runs_to_the_context_window(api):
    base_url, _, worker, _ = api
    async with sdk(base_url) as client:
        completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    request, _ = worker.seen[completion.id]
    assert request.sampling.max_tokens == 512 - request.prompt_tokens  # the heartbeat's context window
    assert completion.usage.completion_tokens == request.sampling.max_tokens > 16


async def test_deadline_is_504_with_cancel_and_late_result_dropped(api):
    base_url, pod, _, redis = api
    cancels = redis.pubsub()
    await cancels.subscribe(constants.REDIS_CANCELS_CHANNEL)
    await cancels.get_message(timeout=1)  # the subscribe confirmation
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:
            started = time.monotonic()
            response = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "silent"}, headers={"x-llmq-timeout-ms": "400"}
            )
        elapsed_s = time.monotonic() - started
        assert response.status_code == 504 and 0.35 < elapsed_s < 5
        error = response.json()["error"]
        assert error["type"] == "timeout_error" and error["code"] == "deadline_exceeded"
        request_id = response.headers["x-request-id"]
        cancel = await _next_cancel(cancels, request_id)
        assert cancel == wire.Cancel(request_id=request_id, reason="deadline_exceeded")
    finally:
        await cancels.aclose()
    dropped_before = pod.registry.dropped
    late = wire.FinalResult(
        request_id=request_id,
        outcome=wire.Outcome.SUCCEEDED,
        model=MODEL,
        reply_to=wire.HttpReply(instance_id=pod.instance_id),
    )
    await redis.publish(constants.replies_channel(pod.instance_id), wire.encode(late))
    await _eventually(lambda: pod.registry.dropped == dropped_before + 1)


async def test_deadline_cancel_goes_out_while_the_pods_redis_pool_is_exhausted(api):
    """A flood of 3,000 requests lost 17 Cancels to MaxConnectionsError: they went through the pod's shared pool."""
    base_url, pod, worker, redis = api
    cancels = redis.pubsub()
    await cancels.subscribe(constants.REDIS_CANCELS_CHANNEL)
    await cancels.get_message(timeout=1)
    pool, held = pod.redis.connection_pool, []
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:
            call = asyncio.create_task(
                client.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "silent"}, headers={"x-llmq-timeout-ms": "2000"}
                )
            )
            await _eventually(
                lambda: any(r.prompt == "silent" and r.request_id in pod.registry for r, _ in worker.seen.values())
            )
            (request_id,) = pod.registry.request_ids()
            with contextlib.suppress(MaxConnectionsError):  # take every connection the pod's pool will give
                while True:
                    held.append(await pool.get_connection())
            with pytest.raises(MaxConnectionsError):
                await pod.redis.get("any")
            response = await call
        assert response.status_code == 504 and response.headers["x-request-id"] == request_id
        assert await _next_cancel(cancels, request_id) == wire.Cancel(request_id=request_id, reason="deadline_exceeded")
    finally:
        for connection in held:
            await pool.release(connection)
        await cancels.aclose()


async def test_stream_deadline_ends_with_error_event_then_done(api):
    base_url, _, _, _ = api
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:
        response = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "silent", "stream": True},
            headers={"x-llmq-timeout-ms": "300"},
        )
    frames = [f[len(b"data: ") :] for f in response.content.split(b"\n\n") if f]
    assert response.status_code == 200 and frames[-1] == b"[DONE]"
    assert msgspec.json.decode(frames[-2])["error"]["code"] == "deadline_exceeded"


async def test_client_disconnect_publishes_cancel(api):
    base_url, pod, worker, redis = api
    cancels = redis.pubsub()
    await cancels.subscribe(constants.REDIS_CANCELS_CHANNEL)
    await cancels.get_message(timeout=1)
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:
            call = asyncio.create_task(client.post("/v1/completions", json={"model": MODEL, "prompt": "silent"}))
            await _eventually(
                lambda: any(r.prompt == "silent" and r.request_id in pod.registry for r, _ in worker.seen.values())
            )
            (request_id,) = [r for r in pod.registry.request_ids()]
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        cancel = await _next_cancel(cancels, request_id)
        assert cancel.reason == "client_disconnected"
        assert request_id not in pod.registry
    finally:
        await cancels.aclose()


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        *builders.UNREADABLE_BODIES,
        ({"json": {"model": "gpt-nope", "prompt": "a"}}, 404, "model"),
        ({"json": {"model": MODEL, "prompt": "a", "max_tokens": "many"}}, 400, "max_tokens"),
        ({"json": {"model": MODEL, "prompt": "a", "temperature": 9}}, 400, "temperature"),
        ({"json": {"model": MODEL, "prompt": ""}}, 400, "prompt"),
        ({"json": {"model": MODEL, "prompt": "a" * 500, "max_tokens": 100}}, 400, "max_tokens"),
        ({"json": {"model": MODEL, "prompt": "a" * (5 * 1024 * 1024)}}, 413, None),
    ],
)
async def test_client_errors_are_answered_before_kafka(api, kwargs, status, param):
    base_url, _, worker, _ = api
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:
        response = await client.post("/v1/completions", **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    request_id = response.headers["x-request-id"]
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client:  # produced after it, answered:
        after = await client.post("/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 1})
    assert after.status_code == 200 and after.headers["x-request-id"] in worker.seen  # the worker read past it
    assert request_id not in worker.seen


async def test_chat_errors_name_the_param(api):
    base_url, _, _, _ = api
    async with sdk(base_url) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL, messages=[])
        assert info.value.body["param"] == "messages"
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
        assert info.value.body["code"] == "model_not_found"


async def test_models_include_heartbeat_models_and_metrics_count(api):
    base_url, pod, _, redis = api
    announced = f"apitest-hb-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=base_url, headers=DEV) as client:
        await redis.publish(constants.REDIS_HEARTBEATS_CHANNEL, wire.encode(heartbeat(announced)))

        async def listed() -> dict:
            return {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}

        deadline = time.monotonic() + 5
        while announced not in await listed():
            assert time.monotonic() < deadline, "the heartbeat's model never appeared"
            await asyncio.sleep(0.05)
        models = await listed()
        assert models[announced]["context_window"] == 512 and models["llmq-tiny"]["context_window"] == 8192
        assert (await client.get("/metrics")).status_code == 404  # served apart (--metrics-port), never here
        metrics = pod.metrics.render().decode()
    assert 'outcome="succeeded",region="local",status="200"' in metrics and "llmq_api_in_flight" in metrics


async def test_pod_keys_are_kept_alive(api):
    _, pod, _, redis = api
    beat = wire.decode(await redis.get(constants.pod_key(pod.instance_id)))
    assert isinstance(beat, wire.PodHeartbeat) and beat.instance_id == pod.instance_id
    assert 0 < await redis.pttl(constants.pod_key(pod.instance_id)) <= pod.settings.api.pod_heartbeat_ttl_ms
    assert await redis.exists(constants.alive_key("api", pod.instance_id))


async def test_kafka_unavailable_is_a_fast_503():
    pod = Pod(Settings(kafka={"bootstrap_servers": "127.0.0.1:1"}), f"api-nokafka-{uuid.uuid4().hex[:6]}")
    pod.catalog.observe(heartbeat(MODEL))
    async with serving(pod, wait=False) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=10, headers=DEV) as client:
            started = time.monotonic()
            response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "abc"})
            assert response.status_code == 503 and time.monotonic() - started < 1
            assert response.headers["retry-after"] == "1"
            readyz = await client.get("/readyz")
            assert readyz.status_code == 503 and readyz.json()["kafka_producer"] is False


async def _next_cancel(pubsub, request_id: str) -> wire.Cancel:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = await pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            cancel = wire.decode(message["data"])
            if cancel.request_id == request_id:
                return cancel
    raise AssertionError(f"no Cancel published for {request_id}")


async def _eventually(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def test_tool_calls_through_the_openai_sdk_plain_and_streamed(api):
    base_url, _, worker, _ = api
    asked = {"model": MODEL, "messages": [{"role": "user", "content": "weather?"}], "max_tokens": 8}
    async with sdk(base_url) as client:
        completion = await client.chat.completions.create(**asked, tools=[WEATHER_TOOL], tool_choice="required")
        stream = await client.chat.completions.create(**asked, tools=[WEATHER_TOOL], stream=True)
        chunks = [chunk async for chunk in stream]
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, msgspec.json.decode(call.function.arguments)) == (
        "call_0",
        "get_weather",
        {"city": "Oslo"},
    )
    request, _ = worker.seen[completion.id]
    assert request.structured.kind == constants.TOOL and request.tool_choice == "required"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)  # the held text never reaches the client
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert [(t.index, t.id, t.function.name) for t in calls] == [(0, "call_0", "get_weather")]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert worker.seen[chunks[0].id][0].structured is None  # auto: decoding is free, the answer is read for calls


async def test_response_format_through_the_openai_sdk(api):
    base_url, _, worker, _ = api
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    asked = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with sdk(base_url) as client:
        completion = await client.chat.completions.create(
            **asked, response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                **asked, response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 3}}}
            )
    request, _ = worker.seen[completion.id]
    assert request.structured == wire.Structured(
        kind=constants.JSON_SCHEMA, schema=msgspec.json.encode(schema).decode(), name="r"
    )
    assert refused.value.body["param"] == "response_format" and refused.value.body["code"] == "invalid_schema"

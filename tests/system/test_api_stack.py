"""The API edge against a real stack of processes: two API pods, batcher, two llmq-sim workers, result-router.

llmq-sim runs fixed 2 s batches of at most 8 requests per worker (16 slots in all), so work is long enough to be
interrupted and a burst queues in the batcher. With the suite's own Kafka/Redis the stack reuses them; when
LLMQ_KAFKA_BOOTSTRAP_SERVERS points at shared ones it brings its own Kafka and Redis (the batcher's consumer group must
not meet anyone else's).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
import uuid
from pathlib import Path

import httpx
import msgspec
import pytest
from redis.asyncio import Redis

from llmq_core import constants, wire
from tests import ports
from tests.builders import chat_body
from tests.stacks import RATE_LIMIT_TIMEOUT_MS, shed_wait_env, standalone_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BATCH_TIME_MS = 2000
DEV = {"authorization": "Bearer llmq-dev-key"}
FREE = {"authorization": "Bearer llmq-dev-free-key"}
LIMITED = {"authorization": "Bearer k-limited"}
SHED_WAIT_MS = {"interactive:paid": 15_000, "interactive:free": 5_000, "near_interactive": 2_000, "deferred": 500}


def free_ports(count: int, consecutive: int = 1) -> list[int]:
    """``count`` free ports, each the first of ``consecutive`` free ones (Kafka takes its port and the next)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        span = range(port, port + consecutive)
        if not any(p in span for p in ports) and all(_bindable(p) for p in span):
            ports.append(port)
    return ports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text("keys:\n  - {tenant: limited, key: k-limited, requests_per_min: 3}\n")
    env = {
        "LLMQ_API_KEYS_FILE": str(keys),
        "LLMQ_API_RATE_LIMIT_TIMEOUT_MS": str(RATE_LIMIT_TIMEOUT_MS),
        **shed_wait_env(SHED_WAIT_MS),
    }
    base = ports.block()  # the metrics ports derived from the API ports (+10 and up) are free too
    api_ports = (base, base + 1)
    shape = dict(
        api_ports=api_ports,
        tiny_workers=0,
        sim_workers=2,
        sim_batch_time_ms=BATCH_TIME_MS,
        sim_max_batch_size=8,
        extra_env=env,
    )
    (kafka_port,), (redis_port,) = free_ports(1, consecutive=2), free_ports(1)
    own = dict(
        state_dir=ROOT / "var" / f"test-api-edge-{uuid.uuid4().hex[:6]}", kafka_port=kafka_port, redis_port=redis_port
    )
    with standalone_stack(infra, own, "api-edge", **shape) as running:
        yield running


class PodClient(httpx.AsyncClient):
    """A client of one API pod that also knows where the pod serves /metrics (never on its API port)."""

    def __init__(self, metrics_url: str, **options) -> None:
        super().__init__(**options)
        self.metrics_url = metrics_url


@pytest.fixture
async def pods(stack):
    """(client of pod 0, client of pod 1, the stack's Redis); clients send llmq-dev-key unless told otherwise."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    urls = stack.metrics_urls()
    clients = [
        PodClient(urls[f"api-{i}"], base_url=f"http://127.0.0.1:{port}", headers=DEV, timeout=60, limits=limits)
        for i, port in enumerate(stack.cfg.api_ports)
    ]
    redis = Redis.from_url(stack.cfg.redis_url)
    yield clients[0], clients[1], redis
    for client in clients:
        await client.aclose()
    await redis.aclose()


def sim_answer(prompt: str, max_tokens: int) -> str:
    return (prompt * max_tokens)[:max_tokens]


async def in_flight(client: PodClient) -> float:
    text = (await client.get(client.metrics_url)).text
    return float(re.search(r'^llmq_api_in_flight\{region="local"\} (\S+)$', text, flags=re.M).group(1))


async def stored(redis: Redis, request_id: str, timeout_s: float = 15) -> wire.FinalResult:
    """The result the result-router stored for ``request_id`` (waits for it)."""
    deadline = time.monotonic() + timeout_s
    while (data := await redis.get(constants.result_key(request_id))) is None:
        assert time.monotonic() < deadline, f"no stored result for {request_id}"
        await asyncio.sleep(0.1)
    return wire.decode(data)


async def eventually(check, timeout_s: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} not met in time"
        await asyncio.sleep(0.1)


def reset_on_close(response: httpx.Response) -> None:
    """Make closing this response's connection send a TCP RST (SO_LINGER 0), as a client that vanishes does."""
    sock = response.extensions["network_stream"].get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def events(body: bytes) -> list[bytes]:
    return [frame.removeprefix(b"data: ") for frame in body.split(b"\n\n") if frame]


# --- 1. streaming -----------------------------------------------------------------------------------------------------


async def test_completion_stream_carries_each_token_as_the_worker_emits_it(pods):
    client, _, _ = pods
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    async with client.stream(
        "POST", "/v1/completions", json={"model": "llmq-sim", "prompt": "stream me", "max_tokens": 40, "stream": True}
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                arrivals.append((time.monotonic() - started, chunk["choices"][0]["text"]))
            elif line:
                assert line == "data: [DONE]"
    text_times = [t for t, text in arrivals if text]
    assert "".join(text for _, text in arrivals) == sim_answer("stream me", 40)
    assert len(text_times) >= 20, "tokens were bunched into few writes"
    assert text_times[-1] - text_times[0] > 0.6 * BATCH_TIME_MS / 1000, "tokens were held back"


async def test_chat_stream_with_usage_ends_with_the_usage_chunk_then_done(pods):
    _, client, _ = pods
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body("héllo", 12, stream=True, stream_options={"include_usage": True}),
    )
    frames = events(response.content)
    assert response.status_code == 200 and frames[-1] == b"[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "héllohéllo"  # 12 byte tokens: the 6 bytes of the message, twice
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert all(c["usage"] is None for c in chunks[:-1])


# --- 2. disconnects cancel --------------------------------------------------------------------------------------------


async def test_fifty_streams_reset_after_one_chunk_cancel_everything(pods):
    client, _, redis = pods
    assert await in_flight(client) == 0
    ids: list[str] = []

    async def open_read_reset(i: int) -> None:
        body = chat_body(f"stream {i} ", 200, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
            first = await anext(response.aiter_lines())
            assert first.startswith("data: {")
            reset_on_close(response)

    await asyncio.gather(*(open_read_reset(i) for i in range(50)))
    assert len(set(ids)) == 50
    await eventually(lambda: _is_zero(client), what="in-flight back to 0")
    results = [await stored(redis, request_id) for request_id in ids]
    assert {r.outcome for r in results} == {wire.Outcome.CANCELED}
    aborted = [r for r in results if r.worker_id is not None]  # running on a worker: aborted mid-generation
    dropped = [r for r in results if r.worker_id is None]  # still queued in the batcher: dropped there
    assert aborted and dropped, (len(aborted), len(dropped))
    assert all(len(c.text) < 200 for r in aborted for c in r.choices)
    after = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "next", "max_tokens": 4})
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == "next"


async def _is_zero(client: httpx.AsyncClient) -> bool:
    return await in_flight(client) == 0


async def test_non_streaming_client_that_leaves_cancels_its_request(pods):
    _, client, redis = pods
    cancels = redis.pubsub()
    await cancels.subscribe(constants.REDIS_CANCELS_CHANNEL)
    try:
        call = asyncio.create_task(
            client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "bye", "max_tokens": 30})
        )
        await eventually(lambda: _is_positive(client), what="request in flight")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        cancel = await _next_cancel(cancels)
    finally:
        await cancels.aclose()
    assert cancel.reason == "client_disconnected"
    await eventually(lambda: _is_zero(client), what="in-flight back to 0")
    assert (await stored(redis, cancel.request_id)).outcome == wire.Outcome.CANCELED


async def _is_positive(client: httpx.AsyncClient) -> bool:
    return await in_flight(client) > 0


async def _next_cancel(pubsub, timeout_s: float = 5) -> wire.Cancel:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None:
            return wire.decode(message["data"])
    raise AssertionError("no Cancel was published")


# --- 3. deadlines -----------------------------------------------------------------------------------------------------


async def test_deadline_behind_long_work_is_504_on_time_and_cancels_it(pods):
    client, _, redis = pods
    long_work = [
        asyncio.create_task(
            client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "long", "max_tokens": 50})
        )
        for _ in range(4)
    ]
    await asyncio.sleep(0.3)  # the long work is on the workers now
    started = time.monotonic()
    response = await client.post(
        "/v1/completions",
        json={"model": "llmq-sim", "prompt": "probe", "max_tokens": 5},
        headers={"x-llmq-timeout-ms": "600"},
    )
    elapsed_s = time.monotonic() - started
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert 0.55 < elapsed_s < 1.3, elapsed_s  # at its deadline, not when the 2 s batch ends
    result = await stored(redis, response.headers["x-request-id"])
    # queued behind the long work (dropped by the batcher) or inside a 2 s batch (aborted by its worker)
    assert result.outcome in (wire.Outcome.CANCELED, wire.Outcome.EXPIRED)
    assert all(r.status_code == 200 for r in await asyncio.gather(*long_work))


async def test_stream_reaching_its_deadline_ends_with_an_error_event_then_done(pods):
    _, client, _ = pods
    response = await client.post(
        "/v1/completions",
        json={"model": "llmq-sim", "prompt": "slow stream", "max_tokens": 60, "stream": True},
        headers={"x-llmq-timeout-ms": "900"},
    )
    frames = events(response.content)
    assert response.status_code == 200 and frames[-1] == b"[DONE]"
    assert json.loads(frames[-2])["error"]["code"] == "deadline_exceeded"
    assert any(json.loads(f)["choices"][0]["text"] for f in frames[:-2]), "no token streamed before the deadline"


# --- 4. admission -----------------------------------------------------------------------------------------------------


async def test_queue_wait_sheds_deferred_with_retry_after_while_paid_gets_through(pods):
    client, other, _ = pods
    burst = [
        asyncio.create_task(
            client.post("/v1/completions", json={"model": "llmq-sim", "prompt": f"b{i}", "max_tokens": 3})
        )
        for i in range(40)
    ]
    shed = None
    deadline = time.monotonic() + 8
    while shed is None and time.monotonic() < deadline:
        response = await other.post(
            "/v1/completions",
            json={"model": "llmq-sim", "prompt": "d", "stream": True},
            headers={"x-llmq-class": "deferred", "x-llmq-timeout-ms": "300"},
        )
        if response.status_code == 429:
            shed = response
        else:
            await asyncio.sleep(0.25)
    assert shed is not None, "deferred was never shed while 24+ requests queued for seconds"
    assert shed.headers["content-type"] == "application/json" and b"data:" not in shed.content
    assert shed.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(shed.headers["retry-after"]) <= 60
    paid = await other.post("/v1/completions", json={"model": "llmq-sim", "prompt": "paid", "max_tokens": 4})
    assert paid.status_code == 200
    assert [r.status_code for r in await asyncio.gather(*burst)] == [200] * 40
    metrics = (await other.get(other.metrics_url)).text
    assert (
        'llmq_api_admission_rejections_total{priority_class="deferred",reason="queue_wait",region="local"}' in metrics
    )


async def test_tenant_rate_limit_is_shared_by_both_pods(pods):
    first, second, _ = pods
    body = {"model": "llmq-sim", "prompt": "rl", "max_tokens": 2}
    responses = await asyncio.gather(
        *(client.post("/v1/completions", json=body, headers=LIMITED) for client in (first, second, first, second))
    )
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 429]  # 3 per minute, wherever they land
    (refused,) = [r for r in responses if r.status_code == 429]
    assert refused.json()["error"]["type"] == "requests" and 1 <= int(refused.headers["retry-after"]) <= 20


# --- 5. authentication ------------------------------------------------------------------------------------------------


async def test_unknown_key_is_401_and_free_key_runs_as_its_tenant(pods):
    client, _, redis = pods
    refused = await client.post(
        "/v1/completions", json={"model": "llmq-sim", "prompt": "x"}, headers={"authorization": "Bearer sk-unknown"}
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    ok = await client.post(
        "/v1/completions", json={"model": "llmq-sim", "prompt": "free", "max_tokens": 2}, headers=FREE
    )
    result = await stored(redis, ok.json()["id"])
    assert result.tenant_id == "dev-free"


# --- 7. idempotency ---------------------------------------------------------------------------------------------------


async def test_idempotent_retry_on_the_other_pod_gets_the_stored_result(pods):
    first, second, redis = pods
    headers = {"idempotency-key": f"order-{uuid.uuid4().hex}"}
    body = {"model": "llmq-sim", "prompt": "pay once", "max_tokens": 8}
    original = await first.post("/v1/completions", json=body, headers=headers)
    await stored(redis, original.json()["id"])
    retry = await second.post("/v1/completions", json=body, headers=headers)
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json()["id"] == original.json()["id"] and retry.json()["choices"] == original.json()["choices"]
    fetched = await second.get(f"/v1/requests/{original.json()['id']}")
    assert fetched.json()["status"] == "succeeded" and fetched.json()["response"]["choices"][0]["text"] == "pay once"
    assert (await second.get(f"/v1/requests/{original.json()['id']}", headers=FREE)).status_code == 404


async def test_idempotent_retry_joins_the_request_still_running(pods):
    first, second, _ = pods
    headers = {"idempotency-key": f"order-{uuid.uuid4().hex}"}
    body = {"model": "llmq-sim", "prompt": "join me", "max_tokens": 7}
    original = asyncio.create_task(first.post("/v1/completions", json=body, headers=headers))
    await asyncio.sleep(0.4)  # produced and running: its 2 s batch has begun
    retry = await second.post("/v1/completions", json=body, headers=headers)
    original = await original
    assert retry.status_code == original.status_code == 200
    assert retry.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in original.headers
    assert retry.json()["id"] == original.json()["id"]
    assert msgspec.json.decode(retry.content)["choices"][0]["text"] == "join me"


async def test_chat_without_max_tokens_runs_to_the_context_window_on_a_real_worker(pods):
    """OpenAI's chat contract: no max_tokens, no limit but the window; the worker's own context check agrees."""
    _, client, _ = pods
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "llmq-sim", "messages": [{"role": "user", "content": "go on"}], "max_tokens": None},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    usage, window = body["usage"], 8192  # llmq-sim's context window
    assert body["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == window - usage["prompt_tokens"] > 16

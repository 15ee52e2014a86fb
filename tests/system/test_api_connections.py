"""Connection bounds of a real API pod process over real sockets (issue 12, items 7 and 8).

One pod for the module, with short timeouts (header and body 300 ms, keep-alive 1 s) and a cap of 4 connections per
client address; a fake worker (tests/inprocess/test_api.py) answers its requests over the real Kafka and Redis.
Slow clients are raw sockets; everything else is httpx. Waiting on a real timeout is unavoidable here: each wait is
bounded by a deadline, and the assertions hold for any machine speed above the timeouts' own floor.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from redis.asyncio import Redis

from llmq_core import ids
from llmq_core.constants import ACTIVE_JOBS_KEY, job_key, job_lines_key, job_offsets_key, job_results_key
from llmq_core.settings import Settings
from tests.inprocess.test_api import DEV, FakeWorker, pod_process

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = BODY_TIMEOUT_S = 0.3
KEEP_ALIVE_S = 1.0
MAX_PER_CLIENT = 4
SLACK_S = 3.0  # a loaded 2-core machine may run a timer this late
OTHER_ADDRESS = "127.0.0.2"  # loopback too: a second client address on one machine


@pytest.fixture(scope="module")
async def pod(tmp_path_factory):
    """(base_url, port, fake worker) of a pod process with short connection limits."""
    settings = Settings()
    instance_id = f"api-conn-{uuid.uuid4().hex[:6]}"
    worker = FakeWorker(settings, ids.instance_id(settings.region.name, instance_id))  # the process qualifies its id
    await worker.start()
    state = tmp_path_factory.mktemp("api-connections")
    limits = {
        "LLMQ_API_HEADER_TIMEOUT_MS": str(int(HEADER_TIMEOUT_S * 1000)),
        "LLMQ_API_BODY_TIMEOUT_MS": str(int(BODY_TIMEOUT_S * 1000)),
        "LLMQ_API_KEEP_ALIVE_TIMEOUT_MS": str(int(KEEP_ALIVE_S * 1000)),
        "LLMQ_API_MAX_CONNECTIONS_PER_CLIENT": str(MAX_PER_CLIENT),
        "LLMQ_FILES_URL": str(state / "files"),
    }
    try:
        async with pod_process(instance_id, state / "api.log", **limits) as (base_url, _):
            yield base_url, urlsplit(base_url).port, worker
    finally:
        await worker.stop()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=SLACK_S + 5, source_address=(source, 0))


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def _json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


async def test_a_socket_that_sends_nothing_is_closed_within_the_header_timeout(pod):
    _, port, _ = pod
    with _connect(port) as sock:
        data, took_s = await asyncio.to_thread(_read_until_closed, sock)
    assert data == b"" and HEADER_TIMEOUT_S * 0.9 <= took_s < HEADER_TIMEOUT_S + SLACK_S


async def test_headers_sent_a_byte_at_a_time_get_408_within_the_header_timeout(pod):
    _, port, _ = pod
    request = b"GET /healthz HTTP/1.1\r\nHost: pod\r\n\r\n"

    def dribble(sock: socket.socket) -> None:
        for byte in request[:-1]:  # never complete: only the deadline can end this
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(HEADER_TIMEOUT_S / 10)

    with _connect(port) as sock:
        start = time.monotonic()
        sender = asyncio.create_task(asyncio.to_thread(dribble, sock))
        data, _ = await asyncio.to_thread(_read_until_closed, sock)
        took_s = time.monotonic() - start
        await sender
    assert data.startswith(b"HTTP/1.1 408 ") and _json_body(data)["error"]["code"] == "request_timeout"
    assert took_s < HEADER_TIMEOUT_S + SLACK_S


async def test_a_body_shorter_than_its_content_length_gets_408_within_the_body_timeout(pod):
    _, port, worker = pod
    body = b'{"model": "llmq-sim", "prompt": "cut short"}'
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\nAuthorization: "
        + DEV["authorization"].encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (len(body) + 10)
    )
    with _connect(port) as sock:
        sock.sendall(head + body)
        data, took_s = await asyncio.to_thread(_read_until_closed, sock)
    assert data.startswith(b"HTTP/1.1 408 ") and "body" in _json_body(data)["error"]["message"]
    assert BODY_TIMEOUT_S * 0.9 <= took_s < BODY_TIMEOUT_S + SLACK_S
    assert not any(request.prompt == "cut short" for request, _ in worker.seen.values())  # nothing was queued


async def test_an_idle_kept_alive_connection_closes_after_the_keep_alive_timeout(pod):
    _, port, _ = pod
    with _connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: pod\r\n\r\n")
        data, took_s = await asyncio.to_thread(_read_until_closed, sock)
    assert data.startswith(b"HTTP/1.1 200 ")
    assert KEEP_ALIVE_S * 0.9 <= took_s < KEEP_ALIVE_S + SLACK_S


async def test_requests_and_streams_longer_than_every_timeout_are_not_cut(pod):
    base_url, _, _ = pod
    async with httpx.AsyncClient(base_url=base_url, headers=DEV, timeout=30) as client:
        plain = await client.post(
            "/v1/completions", json={"model": "llmq-sim", "prompt": "slow:1200 abc", "max_tokens": 4}
        )
        assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == "slow"
        events = []
        async with client.stream(
            "POST",
            "/v1/completions",
            json={"model": "llmq-sim", "prompt": "trickle:1200 xyz", "max_tokens": 6, "stream": True},
        ) as stream:
            assert stream.status_code == 200
            events = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == "trickl"
        again = await client.get("/healthz")  # the same kept-alive connection serves the next request
        assert again.status_code == 200


async def test_the_connection_past_the_cap_is_refused_while_another_address_is_served(pod):
    base_url, port, worker = pod
    tag = uuid.uuid4().hex[:6]
    clients = [httpx.AsyncClient(base_url=base_url, headers=DEV, timeout=30) for _ in range(MAX_PER_CLIENT)]
    other = httpx.AsyncClient(
        base_url=base_url, headers=DEV, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=OTHER_ADDRESS)
    )
    try:
        held = [
            asyncio.create_task(
                client.post(
                    "/v1/completions", json={"model": "llmq-sim", "prompt": f"slow:2500 {tag}{i}", "max_tokens": 4}
                )
            )
            for i, client in enumerate(clients)
        ]
        deadline = time.monotonic() + 20
        while sum(request.prompt.startswith(f"slow:2500 {tag}") for request, _ in worker.seen.values()) < len(held):
            assert time.monotonic() < deadline, "the held requests never reached the worker"
            await asyncio.sleep(0.02)
        with _connect(port) as sock:  # the cap's 5th connection from 127.0.0.1
            refused, _ = await asyncio.to_thread(_read_until_closed, sock)
        assert refused.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1" in refused
        assert _json_body(refused)["error"]["code"] == "too_many_connections"
        served = await other.get("/healthz")
        assert served.status_code == 200
        assert [r.status_code for r in await asyncio.gather(*held)] == [200] * MAX_PER_CLIENT
        assert (await clients[0].get("/healthz")).status_code == 200  # a held one, reused once its request ended
    finally:
        await asyncio.gather(*(c.aclose() for c in [*clients, other]))


async def test_a_batch_line_with_a_5000_digit_logit_bias_key_is_its_own_error(pod):
    """Issue 12 item 7 end to end: the batch is created (no 500) and the line fails alone."""
    base_url, _, _ = pod
    huge = "9" * 5000
    lines = [
        json.dumps(
            {
                "custom_id": "bad",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "llmq-sim", "prompt": "x", "max_tokens": 1},
            }
        ).replace('"max_tokens": 1', f'"max_tokens": 1, "logit_bias": {{"{huge}": 1}}'),
        json.dumps(
            {
                "custom_id": "good",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "llmq-sim", "prompt": "x", "max_tokens": 1},
            }
        ),
    ]
    async with httpx.AsyncClient(base_url=base_url, headers=DEV, timeout=30) as client:
        upload = await client.post(
            "/v1/files", files={"file": ("in.jsonl", "\n".join(lines).encode())}, data={"purpose": "batch"}
        )
        assert upload.status_code == 200, upload.text
        created = await client.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
        )
        assert created.status_code == 200, created.text
        await _forget_job(created.json()["id"])
        assert created.json()["request_counts"]["total"] == 2
        timeout = await client.post(
            "/v1/completions", json={"model": "llmq-sim", "prompt": "x"}, headers={"x-llmq-timeout-ms": huge}
        )
        assert timeout.status_code == 400 and timeout.json()["error"]["param"] == "x-llmq-timeout-ms"


async def _forget_job(batch_id: str) -> None:
    """No result-router sharing this Redis may ever drive the job (its files live in this module's directory)."""
    redis = Redis.from_url(Settings().redis.url)
    try:
        await redis.srem(ACTIVE_JOBS_KEY, batch_id)
        await redis.delete(*(key(batch_id) for key in (job_key, job_lines_key, job_offsets_key, job_results_key)))
    finally:
        await redis.aclose()


def _pod_process(port: int) -> psutil.Process:
    """The pod process listening on ``port``."""
    [pid] = {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    }
    return psutil.Process(pid)


async def test_headers_past_the_cap_get_431_and_the_pod_stays_small_and_serving(pod):
    """QA finding: four connections writing one never-ending header at 1 MB a write grew a pod by 335 MB and starved
    its heartbeat. Each is cut at LLMQ_API_MAX_HEADER_BYTES (64 KiB) with a 431, long before the header timeout (here
    as many as the per-address cap leaves room for beside the request that must be served meanwhile)."""
    base_url, port, _ = pod
    process = _pod_process(port)
    rss_before = process.memory_info().rss
    megabyte = b"a" * (1 << 20)

    def flood() -> bytes:
        with _connect(port) as sock:
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: pod\r\nX-A: ")
                for _ in range(8):
                    sock.sendall(megabyte)
            except OSError:  # cut off: what it was answered is what counts
                pass
            return _read_until_closed(sock)[0]

    floods = [asyncio.create_task(asyncio.to_thread(flood)) for _ in range(MAX_PER_CLIENT - 1)]  # one left to serve
    async with httpx.AsyncClient(base_url=base_url, timeout=SLACK_S + 5) as client:
        assert (await client.get("/healthz")).status_code == 200  # another connection is served meanwhile
    answers = await asyncio.gather(*floods)
    assert all(a.startswith(b"HTTP/1.1 431 ") for a in answers), [a[:60] for a in answers]
    assert _json_body(answers[0])["error"]["code"] == "headers_too_large"
    assert process.memory_info().rss - rss_before < 50 << 20

"""The API pod's HTTP edge over real sockets (issue 34, items 7, 8 and 9): one pod for the module, served by uvicorn
with the settings' connection limits (``uvicorn_options``, as ``llmq_api.main`` runs it) and a cap of 2 connections
per client address. Clients are raw sockets that do what HTTP clients do: send the whole request, then read the
answer until the pod closes. Nothing waits on a timer: each wait is for a condition, bounded.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from llmq_api.connections import uvicorn_options
from llmq_api.pod import Pod
from llmq_core.names import Names
from llmq_core.requests import ECHOED_CHARS
from llmq_core.settings import Settings
from tests.inprocess.test_api import DEV, serving

pytestmark = pytest.mark.integration

CAP = 2
SOCKET_TIMEOUT_S = 30
WAIT_S = 20


@pytest.fixture(scope="module")
async def edge():
    """(base_url, port, the pod's per-address connection counts)."""
    settings = Settings(api={"max_connections_per_client": CAP, "header_timeout_ms": 120_000})
    instance_id = f"api-edge-{uuid.uuid4().hex[:8]}"
    pod = Pod(settings, instance_id, names=Names(saturation_key=f"apitest-saturation-{instance_id}"))
    options = uvicorn_options(settings)
    async with serving(pod, **options) as base_url:
        yield base_url, urlsplit(base_url).port, options["http"].clients


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def _connect(port: int, send_buffer_bytes: int | None = None) -> socket.socket:
    sock = socket.socket()
    if send_buffer_bytes:  # fixed (no autotuning): a larger request cannot sit in the kernel while the pod is gone
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    sock.settimeout(SOCKET_TIMEOUT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send all of ``request``, then read until the server closes (a reset raises, as it does in any HTTP client)."""
    sock.sendall(request)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _responses(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(status, head, body) of each response in ``data``, in order (bodies by their Content-Length)."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        responses.append((int(head.split(b" ", 2)[1]), head, rest[:length]))
        data = rest[length:]
    return responses


async def test_a_connection_past_the_cap_reads_its_429_not_a_reset(edge):
    """Item 7: the pod closed the connection past the cap at once, while the request still arrived, and the kernel's
    reset ended the client's write before it could read the 429."""
    _, port, clients = edge
    await _until(lambda: not clients.open, "earlier connections were never released")
    held = [_connect(port) for _ in range(CAP)]
    try:
        await _until(lambda: clients.open.get("127.0.0.1") == CAP, "the held connections were never counted")
        body = b"x" * (1 << 20)
        head = b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\nContent-Length: %d\r\n\r\n" % len(body)
        with _connect(port, send_buffer_bytes=4096) as refused:
            answer = await asyncio.to_thread(_exchange, refused, head + body)
    finally:
        for sock in held:
            sock.close()
    [(status, head, body)] = _responses(answer)
    assert status == 429 and b"retry-after: 1" in head
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    await _until(lambda: not clients.open, "the held connections were never released")


async def test_garbage_after_a_complete_request_gets_the_answer_then_a_400(edge):
    """Item 8: the garbage closed the connection while the first request was being answered: no answer at all."""
    _, port, _ = edge
    with _connect(port) as sock:
        data = await asyncio.to_thread(_exchange, sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n")
    (first, _, answer), (second, head, error) = _responses(data)
    assert (first, json.loads(answer)) == (200, {"status": "ok"})
    assert second == 400 and b"connection: close" in head
    assert json.loads(error)["error"]["code"] == "invalid_http_request"


async def test_a_3_mb_model_name_gets_a_404_that_quotes_40_characters_of_it(edge):
    """Item 9: the 404 echoed all 3,000,000 characters."""
    base_url, _, _ = edge
    async with httpx.AsyncClient(base_url=base_url, headers=DEV, timeout=SOCKET_TIMEOUT_S) as client:
        response = await client.post("/v1/completions", json={"model": "M" * 3_000_000, "prompt": "hi"})
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "model_not_found" and error["param"] == "model"
    assert "M" * ECHOED_CHARS in error["message"] and "M" * (ECHOED_CHARS + 1) not in error["message"]
    assert len(response.content) < 400

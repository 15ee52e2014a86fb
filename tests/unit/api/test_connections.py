"""The connection guard's decisions, driven by hand: a fake transport and a loop whose timers the test fires.

The real sockets and real timeouts are in tests/system/test_api_connections.py.
"""

import asyncio
import json

import pytest
import uvicorn
from uvicorn.server import ServerState

from llmq_api.connections import (
    REFUSED_HEAD_S,
    REFUSED_LINGER_S,
    ClientConnections,
    ConnectionLimits,
    guarded_protocol,
    limits_from,
    parse_networks,
    uvicorn_options,
)
from llmq_core.settings import Settings

LIMITS = ConnectionLimits(
    header_timeout_s=10.0,
    body_timeout_s=60.0,
    max_per_client=2,
    trusted_proxies=parse_networks("10.0.0.0/8, 192.168.1.5"),
)
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\nContent-Length: 10\r\n\r\n"


class Timer:
    def __init__(self, delay_s: float, callback) -> None:
        self.delay_s, self.callback, self.cancelled = delay_s, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class HandLoop:
    """call_later only records; create_task runs on the real loop (the ASGI app of a request)."""

    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def call_later(self, delay_s, callback):
        self.timers.append(Timer(delay_s, callback))
        return self.timers[-1]

    def create_task(self, coro, **kwargs):
        return asyncio.get_running_loop().create_task(coro, **kwargs)

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    def fire(self) -> None:
        (timer,) = self.armed()
        timer.cancelled = True
        timer.callback()


class FakeTransport:
    def __init__(self, peer: str) -> None:
        self.peer, self.written, self.closed, self.eof = peer, b"", False, False

    def get_extra_info(self, name, default=None):
        return {"peername": (self.peer, 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def read_body(scope, receive, send):
    """Reads the whole body, then answers 200 (or nothing when the client is gone)."""
    while (message := await receive())["type"] == "http.request" and message["more_body"]:
        pass
    if message["type"] == "http.request":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def connect():
    protocol_class = guarded_protocol(LIMITS)
    config = uvicorn.Config(read_body)
    state = ServerState()

    def make(peer: str = "203.0.113.7"):
        loop, transport = HandLoop(), FakeTransport(peer)
        protocol = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
        protocol.connection_made(transport)
        return protocol, loop, transport

    return make


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline_without_a_response(connect):
    protocol, loop, transport = connect()
    assert [t.delay_s for t in loop.armed()] == [LIMITS.header_timeout_s]
    loop.fire()
    assert transport.closed and transport.written == b""


def test_headers_still_arriving_at_the_deadline_get_408(connect):
    protocol, loop, transport = connect()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nHo")
    protocol.data_received(b"st: p")  # more bytes do not push the deadline back
    assert len(loop.armed()) == 1
    loop.fire()
    assert transport.written.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in transport.written
    assert transport.closed


async def test_a_short_body_gets_408_at_the_body_deadline_and_the_app_reads_a_disconnect(connect):
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"12345")
    assert [t.delay_s for t in loop.armed()] == [LIMITS.body_timeout_s]
    await asyncio.sleep(0)  # the app starts and waits for the rest
    loop.fire()
    assert transport.written.startswith(b"HTTP/1.1 408 ") and transport.closed
    assert protocol.cycle.disconnected


async def test_an_anthropic_callers_short_body_gets_anthropics_408(connect):
    protocol, loop, transport = connect()
    protocol.data_received(HEAD.replace(b"/v1/completions", b"/v1/messages") + b"12345")
    await asyncio.sleep(0)
    loop.fire()
    body = json.loads(transport.written.partition(b"\r\n\r\n")[2])
    assert transport.written.startswith(b"HTTP/1.1 408 ") and body["error"]["type"] == "timeout_error"
    assert body["type"] == "error" and body["error"]["message"].startswith("The request's body did not arrive")


async def test_no_deadline_runs_while_the_app_works_and_keep_alive_takes_over_after_the_response(connect):
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"1234567890")
    assert loop.armed() == []  # headers and body complete: the app may take as long as the request's deadline
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 ") and not transport.closed
    assert [t.delay_s for t in loop.armed()] == [5]  # uvicorn's keep-alive timer (Config's default here)
    protocol.data_received(b"GET /healthz HTTP/1.1\r\n")  # the next request's first bytes: a header deadline again
    assert [t.delay_s for t in loop.armed()] == [LIMITS.header_timeout_s]


def refused(protocol) -> bool:
    return protocol._refusal is not None


def test_the_connection_past_the_cap_is_refused_while_other_addresses_connect(connect):
    first, _, _ = connect("203.0.113.7")
    connect("203.0.113.7")
    assert refused(connect("203.0.113.7")[0])
    assert not refused(connect("203.0.113.8")[0])
    first.connection_lost(None)
    assert not refused(connect("203.0.113.7")[0])  # a closed connection frees its place


def test_a_refused_connection_reads_the_request_head_before_its_429_then_half_closes_and_drops_the_rest(connect):
    """Issue 34 item 7: a 429 written and closed on while the request still arrived was lost in a TCP reset."""
    for _ in range(LIMITS.max_per_client):
        connect()
    protocol, loop, transport = connect()
    assert transport.written == b"" and [t.delay_s for t in loop.armed()] == [REFUSED_HEAD_S]
    protocol.data_received(HEAD[:-3])
    assert transport.written == b""
    protocol.data_received(HEAD[-3:] + b"12345")  # the head's blank line, split across reads
    assert transport.written.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1" in transport.written
    assert b'"code":"too_many_connections"' in transport.written and b"connection: close" in transport.written
    assert transport.eof and not transport.closed and [t.delay_s for t in loop.armed()] == [REFUSED_LINGER_S]
    protocol.data_received(b"67890")  # the body arrives: read, dropped, unanswered
    assert transport.written.count(b"HTTP/1.1 ") == 1
    loop.fire()  # a client that never closes is closed at the linger's end
    assert transport.closed


def test_a_refused_connection_is_answered_at_its_head_deadline_byte_cap_or_end_of_stream(connect):
    for _ in range(LIMITS.max_per_client):
        connect()
    _, loop, transport = connect()
    loop.fire()  # a client that sends nothing
    assert transport.written.startswith(b"HTTP/1.1 429 ") and transport.eof
    endless, _, transport = connect()
    endless.data_received(b"GET / HTTP/1.1\r\nX-A: " + b"a" * LIMITS.max_header_bytes)
    assert transport.written.startswith(b"HTTP/1.1 429 ")
    cut_short, loop, transport = connect()
    cut_short.data_received(b"GET / HT")
    cut_short.eof_received()  # the transport closes once this returns: the 429 goes first
    assert transport.written.startswith(b"HTTP/1.1 429 ")
    cut_short.connection_lost(None)
    assert loop.armed() == []


def test_trusted_proxies_are_not_capped(connect):
    assert not any(refused(connect("10.1.2.3")[0]) for _ in range(LIMITS.max_per_client + 3))
    assert not any(refused(connect("192.168.1.5")[0]) for _ in range(LIMITS.max_per_client + 3))


def test_client_connections_count_per_address():
    clients = ClientConnections(limit=1)
    assert clients.admit("a") and clients.admit("b") and not clients.admit("a")
    clients.release("a")
    assert clients.admit("a") and clients.open == {"a": 1, "b": 1}
    assert all(ClientConnections(limit=0).admit("a") for _ in range(100))  # 0: no cap


def test_trusted_proxies_setting_is_checked_at_start():
    assert parse_networks("") == () and len(parse_networks("127.0.0.1, ::1, 10.0.0.0/8")) == 3
    with pytest.raises(ValueError, match="LLMQ_API_TRUSTED_PROXIES.*'proxy.local'"):
        parse_networks("10.0.0.1,proxy.local")
    assert not LIMITS.trusts("unix-socket-peer")


def test_uvicorn_options_follow_the_settings():
    settings = Settings(
        api={
            "header_timeout_ms": 300,
            "body_timeout_ms": 400,
            "keep_alive_timeout_ms": 1500,
            "max_connections_per_client": 7,
        },
    )
    options = uvicorn_options(settings)
    assert options["timeout_keep_alive"] == 1.5 and options["ws"] == "none" and options["proxy_headers"] is False
    assert limits_from(settings) == ConnectionLimits(header_timeout_s=0.3, body_timeout_s=0.4, max_per_client=7)
    assert options["http"].clients.limit == 7
    behind_proxy = uvicorn_options(Settings(api={"trusted_proxies": "10.0.0.0/8"}))
    assert behind_proxy["proxy_headers"] is True and behind_proxy["forwarded_allow_ips"] == ["10.0.0.0/8"]


def test_headers_past_the_byte_cap_get_431_before_more_is_parsed(connect):
    protocol, loop, transport = connect()
    cap = LIMITS.max_header_bytes
    protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nX-A: ")
    for _ in range(cap // 4096 + 1):  # an endless header in small reads: refused once the cap is crossed
        if transport.closed:
            break
        protocol.data_received(b"a" * 4096)
    assert transport.written.startswith(b"HTTP/1.1 431 ") and b'"code":"headers_too_large"' in transport.written
    assert transport.closed and protocol._header_bytes <= cap + 4096


async def test_headers_just_under_the_cap_and_a_body_in_the_same_read_are_served(connect):
    protocol, _, transport = connect()
    head = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\nX-A: "
    pad = LIMITS.max_header_bytes - len(head) - 4
    protocol.data_received(head + b"a" * pad + b"\r\n\r\n" + b"1234567890" * 1)  # the body lies past the cap
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "header",
    [
        b"Content-Length: " + b"9" * 5000,
        b"Content-Length: -1",
        b"Content-Length: 10\r\nContent-Length: 20",
        b"Content-Length: 3\r\nTransfer-Encoding: chunked",
    ],
)
def test_a_malformed_content_length_gets_the_openai_error_object(connect, header):
    protocol, _, transport = connect()
    protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\n" + header + b"\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 400 ") and transport.closed
    body = json.loads(transport.written.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["param"] == "Content-Length" and body["error"]["code"] == "invalid_http_request"


async def test_reading_stays_paused_while_pipelined_requests_wait(connect):
    protocol, _, transport = connect()
    protocol.data_received((HEAD + b"1234567890") * 3)
    assert protocol.flow.read_paused
    for _ in range(10):
        await asyncio.sleep(0)
        if transport.written.count(b"HTTP/1.1 200 ") == 1:
            assert protocol.flow.read_paused  # one answered, one still queued: no more reads yet
    while transport.written.count(b"HTTP/1.1 200 ") < 3:
        await asyncio.sleep(0)
    assert not protocol.flow.read_paused


async def _answered(transport: FakeTransport, responses: int) -> None:
    for _ in range(50):
        if transport.written.count(b"HTTP/1.1 ") >= responses and transport.closed:
            return
        await asyncio.sleep(0)


@pytest.mark.parametrize("requests", [1, 2])
async def test_garbage_after_complete_requests_gets_their_answers_then_a_400(connect, requests):
    """Issue 34 item 8: the garbage closed the connection while the first request was being answered, so it got
    no answer at all."""
    protocol, loop, transport = connect()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * requests + b"GARBAGE\r\n\r\n")
    assert transport.written == b"" and not transport.closed and protocol.flow.read_paused
    assert loop.armed() == []  # no deadline cuts the answers short
    await _answered(transport, requests + 1)
    *answers, last = transport.written.split(b"HTTP/1.1 ")[1:]
    assert [a[:4] for a in answers] == [b"200 "] * requests and last.startswith(b"400 ") and transport.closed
    assert json.loads(last.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_http_request"


async def test_a_pipelined_request_past_the_header_cap_gets_431_after_the_answer_before_it(connect):
    protocol, _, transport = connect()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nX-A: " + b"a" * LIMITS.max_header_bytes)
    await _answered(transport, 2)
    assert transport.written.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 431 " in transport.written
    assert transport.closed


@pytest.mark.parametrize("version", [b"1.0", b"1.1"])
async def test_a_stream_to_an_http_1_0_client_is_sent_unchunked_then_closed(version):
    """HTTP/1.0 has no chunked transfer coding (RFC 9112): a response without a Content-Length (an SSE stream) goes
    out as it comes and the connection's close ends it; an HTTP/1.1 one stays chunked."""
    done = asyncio.Event()

    async def stream(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        done.set()

    protocol_class = guarded_protocol(LIMITS)
    loop, transport = HandLoop(), FakeTransport("203.0.113.7")
    protocol = protocol_class(config=uvicorn.Config(stream), server_state=ServerState(), app_state={}, _loop=loop)
    protocol.connection_made(transport)
    protocol.data_received(b"GET /v1/stream HTTP/" + version + b"\r\nHost: pod\r\n\r\n")
    await asyncio.wait_for(done.wait(), 5)
    head, _, body = transport.written.partition(b"\r\n\r\n")
    if version == b"1.0":
        assert b"transfer-encoding" not in head.lower() and body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        assert transport.closed
    else:
        assert b"transfer-encoding: chunked" in head.lower() and body.endswith(b"0\r\n\r\n") and not transport.closed

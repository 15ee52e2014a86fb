"""Bounds on HTTP connections: header, body and keep-alive timeouts, and open connections per client address.

uvicorn has a keep-alive timeout only, and each byte received restarts it, so a client that sends nothing, a header a
byte a second, or a body shorter than its Content-Length held its connection for good. :func:`guarded_protocol` makes
the httptools protocol uvicorn runs (passed as ``http=``) with three deadlines, none of which runs while the app works
on a request or writes its response (long generations and SSE streams are never cut):
- headers: from the connection's start, or from the first byte of a keep-alive connection's next request, until its
  headers are complete;
- body: from the end of the headers until the body is complete;
- keep-alive: uvicorn's own, between a response and the next request's first byte.
Past the header or body deadline the client gets 408 when a request has begun and no response to it is on its way,
and the connection closes. A connection beyond ``max_per_client`` from one address is answered 429 and closed without
a reset (:class:`Refusal`). A refusal of bytes that follow complete requests (a header deadline, too many header bytes
or no parseable request, pipelined behind them) is the connection's last response, after theirs: reading stops until
they are answered (it once closed the connection at once, so a request followed by garbage got no answer at all).

Bytes are bounded too: a request's headers (request line included) may take ``max_header_bytes``, counted as reads
arrive and before httptools buffers them (it keeps a header being received in memory and copies it on every read, so an
endless header grew the pod by hundreds of MB and stalled its event loop); past it 431 and the connection closes. Reads
stay paused while pipelined requests wait their turn (uvicorn resumed after each response), so one connection holds at
most one read of requests it has not answered. A request httptools cannot parse (a malformed or repeated
Content-Length, or bytes after a request that are no request at all) gets the OpenAI error object, not uvicorn's
plain-text 400.

Meant for direct exposure. The client address is the socket peer; peers listed as trusted proxies are not capped
(the proxy's own limits apply to its clients) and only their ``X-Forwarded-For`` names the client in the request.
"""

from __future__ import annotations

import ipaddress
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from llmq_api.anthropic_format import anthropic_error, speaks_anthropic
from llmq_api.errors import RETRY_AFTER_S, ApiError
from llmq_core.settings import ApiSettings, Settings
from llmq_core.status import ErrorType

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

REFUSED_HEAD_S = 1.0  # how long a refused connection's request head may take to arrive before its 429 goes out
REFUSED_LINGER_S = 2.0  # how long what a refused client sends after its 429 (a body) is read and dropped, at most


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_per_client: int  # 0: no cap
    max_header_bytes: int = ApiSettings.model_fields["max_header_bytes"].default
    trusted_proxies: tuple[Network, ...] = ()

    def trusts(self, address: str) -> bool:
        """Whether ``address`` is a trusted proxy (a non-IP peer, such as a Unix socket's, never is)."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.trusted_proxies)


def limits_from(settings: Settings) -> ConnectionLimits:
    """The limits the settings ask for; ValueError for a trusted proxy that is no address or network."""
    return ConnectionLimits(
        header_timeout_s=settings.api.header_timeout_ms / 1000,
        body_timeout_s=settings.api.body_timeout_ms / 1000,
        max_per_client=settings.api.max_connections_per_client,
        max_header_bytes=settings.api.max_header_bytes,
        trusted_proxies=parse_networks(settings.api.trusted_proxies),
    )


def parse_networks(text: str) -> tuple[Network, ...]:
    """Comma-separated addresses or CIDR networks; ValueError naming the first that is neither."""
    networks = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"LLMQ_API_TRUSTED_PROXIES: {item!r} is not an IP address or network") from None
    return tuple(networks)


class ClientConnections:
    """Open connections per client address, capped at ``limit`` (0: no cap)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Count one more connection from ``address``; False (nothing counted) when it already has ``limit``."""
        if self.limit and self.open[address] >= self.limit:
            return False
        self.open[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


def error_response(error: ApiError, anthropic: bool = False) -> bytes:
    """A complete HTTP/1.1 response carrying ``error``'s OpenAI body (Anthropic's when ``anthropic``: the request's
    head, when it was read, was an Anthropic caller's), after which the connection closes."""
    status, payload, headers = (
        anthropic_error(error, None) if anthropic else (error.status, error.body(), error.response_headers())
    )
    body = msgspec.json.encode(payload)
    head = [
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        *(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()),
    ]
    return b"".join([*head, b"\r\n", body])


def request_timeout(part: str, timeout_s: float) -> ApiError:
    return ApiError(408, f"The request's {part} did not arrive within {timeout_s:g} s", code="request_timeout")


def headers_too_large(limit_bytes: int) -> ApiError:
    return ApiError(431, f"The request's headers exceed {limit_bytes} bytes", code="headers_too_large")


def bad_http_request(reason: str) -> ApiError:
    """The 400 for a request httptools cannot parse; ``reason`` is its fixed text (e.g. "Duplicate Content-Length")."""
    param = "Content-Length" if "content-length" in reason.lower() else None
    return ApiError(400, f"Invalid HTTP request: {reason}", param=param, code="invalid_http_request")


def too_many_connections(limit: int) -> ApiError:
    return ApiError(
        429,
        f"This client address already holds {limit} connections",
        type=ErrorType.RATE_LIMIT,
        code="too_many_connections",
        headers={"retry-after": str(RETRY_AFTER_S)},
    )


class Refusal:
    """How a connection past the per-address cap ends, so that its client reads the 429 and not a TCP reset.

    A socket closed while the client's request is still arriving, or with bytes of it unread, is reset by the kernel,
    and the reset discards the 429 on its way. So the request head is read first (until its blank line, for at most
    ``max_head_bytes`` and REFUSED_HEAD_S; the 429 goes out then in any case), then the 429 is written and the
    sending side shut down (the client reads the answer, then the end of the stream), and whatever else it sends is
    read and dropped until it closes (``eof_received``) or REFUSED_LINGER_S pass. Nothing is buffered.
    """

    def __init__(self, transport: Any, loop: Any, response: bytes, max_head_bytes: int) -> None:
        self.transport, self.loop, self.response = transport, loop, response
        self.room = max_head_bytes
        self.tail = b""  # the last bytes read: a head's blank line may begin in one read and end in the next
        self.answered = False
        self.timer = loop.call_later(REFUSED_HEAD_S, self.answer)

    def received(self, data: bytes) -> None:
        if self.answered:
            return
        self.room -= len(data)
        seen = self.tail + data
        if b"\r\n\r\n" in seen or self.room <= 0:
            self.answer()
        self.tail = seen[-3:]

    def answer(self) -> None:
        if self.answered or self.transport.is_closing():
            return
        self.answered = True
        self.timer.cancel()
        self.transport.write(self.response)
        if self.transport.can_write_eof():  # a TLS transport cannot half-close: the linger alone keeps the reset away
            self.transport.write_eof()
        self.timer = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def stop(self) -> None:
        self.timer.cancel()


class UnchunkedCycle(RequestResponseCycle):
    """uvicorn's request cycle for an HTTP/1.0 request: a response without a Content-Length (a stream) is sent as it
    comes, ended by closing the connection, since HTTP/1.0 has no chunked transfer coding (RFC 9112 section 6.1:
    uvicorn sent ``transfer-encoding: chunked`` to 1.0 clients too). HTTP/1.0 connections are never kept alive, so
    uvicorn closes it after the last body message."""

    _unbounded = False  # the response has no Content-Length: its end is the connection's

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            framed = {name.lower() for name, _ in message.get("headers", [])} & {
                b"content-length",
                b"transfer-encoding",
            }
            if not framed:
                self.chunked_encoding = False
                self._unbounded = True
        elif message["type"] == "http.response.body" and self._unbounded:
            # the bytes uvicorn counts down to 0 at the last message: this message's, and more while more come
            self.expected_content_length = len(message.get("body", b"")) + (
                _UNBOUNDED if message.get("more_body", False) else 0
            )
        await super().send(message)


_UNBOUNDED = 1 << 62


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and the per-address cap of :class:`ConnectionLimits`."""

    limits: ConnectionLimits
    clients: ClientConnections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: Any = None  # the armed header or body deadline (an asyncio.TimerHandle)
        self._reading_headers = False  # a request has begun and its headers are not complete
        self._counted: str | None = None  # the address this connection counts against
        self._header_bytes: int | None = 0  # bytes read of the next request's headers; None while a body is read
        self._refusal: Refusal | None = None  # set on a connection past the per-address cap
        self._last_word: ApiError | None = None  # the refusal to send once the responses under way are complete

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and not self.limits.trusts(address):
            if not self.clients.admit(address):
                response = error_response(too_many_connections(self.clients.limit))
                self._refusal = Refusal(self.transport, self.loop, response, self.limits.max_header_bytes)
                return
            self._counted = address
        self._arm(self.limits.header_timeout_s, self._header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refusal is not None:
            self._refusal.stop()
        if self._counted is not None:
            self.clients.release(self._counted)
            self._counted = None
        super().connection_lost(exc)

    def eof_received(self) -> None:
        """The client sent all it will (the transport closes when this returns): a refused one gets its 429 first."""
        if self._refusal is not None:
            self._refusal.answer()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            self._refusal.received(data)
            return
        if self._header_bytes is None:
            super().data_received(data)
            return
        room = self.limits.max_header_bytes - self._header_bytes
        self._header_bytes += len(data)
        if len(data) <= room:
            super().data_received(data)
            return
        if room:
            super().data_received(data[:room])  # the headers may end within the cap; what follows is their body
        if self.transport.is_closing() or self._last_word is not None:
            return
        if self._header_bytes is not None:
            self._refuse(headers_too_large(self.limits.max_header_bytes))
        else:
            super().data_received(data[room:])

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this in its ``except httptools.HttpParserError`` block: the exception says what is wrong."""
        reason = sys.exc_info()[1]
        self._refuse(bad_http_request(str(reason) if reason else msg))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._last_word is not None and self._answerable():
            self._give_up(self._last_word)
        elif self.pipeline or self._last_word is not None:  # uvicorn resumed reading; nothing more may be read now
            self.flow.pause_reading()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        if self._deadline is None:  # a kept-alive connection's next request; a new one's runs since connection_made
            self._arm(self.limits.header_timeout_s, self._header_timeout)

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._header_bytes = None
        self._disarm()
        super().on_headers_complete()
        if self.scope.get("http_version") == "1.0" and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.__class__ = UnchunkedCycle  # the cycle uvicorn just made, for this request; same state
        self._arm(self.limits.body_timeout_s, self._body_timeout)  # on_message_complete disarms it, also at once

    def on_message_complete(self) -> None:
        self._header_bytes = 0  # the next request's headers start with the next byte
        self._disarm()
        super().on_message_complete()

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_timeout(self) -> None:
        self._deadline = None
        if self._reading_headers:
            self._refuse(request_timeout("headers", self.limits.header_timeout_s))
        else:
            self._give_up(None)

    def _answerable(self) -> bool:
        """Whether a response may be written now: none of an earlier request is under way."""
        return self.cycle is None or self.cycle.response_complete

    def _body_timeout(self) -> None:
        self._deadline = None
        if self.pipeline:  # the request waits its turn behind a pipelined one; its body is left unread until then
            self._arm(self.limits.body_timeout_s, self._body_timeout)
            return
        cycle = self.cycle
        answerable = not cycle.response_started
        cycle.disconnected = True  # the app reads a disconnect, and what it sends next goes nowhere
        cycle.message_event.set()
        scope = cycle.scope  # its head was read: the 408 speaks the caller's dialect
        anthropic = speaks_anthropic(scope["path"], (name for name, _ in scope["headers"]))
        self._give_up(request_timeout("body", self.limits.body_timeout_s) if answerable else None, anthropic)

    def _refuse(self, error: ApiError) -> None:
        """Close with ``error`` as the last response, for bytes after the requests read so far: at once when none is
        being answered, else once they are (reading stops meanwhile, and no deadline runs: their responses take what
        they take). Bytes that break the body of the request being answered leave nothing to answer it with: the
        connection just closes."""
        if self._answerable():
            self._give_up(error)
        elif self.cycle.more_body:
            self._give_up(None)
        elif self._last_word is None:
            self._last_word = error
            self._disarm()
            self.flow.pause_reading()

    def _give_up(self, error: ApiError | None, anthropic: bool = False) -> None:
        if self.transport.is_closing():
            return
        if error is not None:
            self.transport.write(error_response(error, anthropic))
        self.transport.close()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.Config`` keywords that apply the settings' connection limits (ValueError: see :func:`limits_from`).

    WebSocket upgrades are off: the API has no WebSocket route, and an upgraded connection would leave this protocol
    (and its count) behind.
    """
    limits = limits_from(settings)
    return {
        "http": guarded_protocol(limits),
        "ws": "none",
        "timeout_keep_alive": settings.api.keep_alive_timeout_ms / 1000,
        "proxy_headers": bool(limits.trusted_proxies),
        "forwarded_allow_ips": [str(network) for network in limits.trusted_proxies],
    }


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)``; its connections share one per-address count."""
    return type(
        "GuardedProtocol", (GuardedProtocol,), {"limits": limits, "clients": ClientConnections(limits.max_per_client)}
    )

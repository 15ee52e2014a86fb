"""The body of ``POST /v1/messages/batches`` split into its requests as it streams in. Pure: no I/O.

The body is ``{"requests": [{"custom_id": ..., "params": {...}}, ...]}`` (its only key, as Anthropic's API takes
it). :class:`RequestSplitter` finds each request's bytes by scanning only the structural characters (braces,
brackets, quotes, backslashes), so it holds one request at a time however large the body; :func:`input_line` turns
a request into the input line the batch engine checks (:mod:`llmq_api.batch_jobs.inputs`: url ``/v1/messages``,
body the params). Every mistake of the body's shape is an :class:`~llmq_api.errors.ApiError` (400) naming the
request at fault.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from llmq_api.errors import ApiError, invalid
from llmq_core.status import ErrorCode
from llmq_jobs import jobs

_OPENING = re.compile(rb'\s*\{\s*"requests"\s*:\s*\[')
MAX_OPENING_BYTES = 1024  # the body's opening, up to the array's '[', is at most this long (whitespace included)
_STRUCTURE = re.compile(rb'[{}\[\]"]')  # outside strings
_IN_STRING = re.compile(rb'["\\]')
_WHITESPACE = b" \t\r\n"
SHAPE = 'The body must be {"requests": [{"custom_id": ..., "params": {...}}, ...]}'


class _Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    custom_id: Any = None
    params: msgspec.Raw = msgspec.Raw(b"")


class RequestSplitter:
    """Feed the body's chunks in order (:meth:`feed`), then :meth:`end`; each returns the requests completed so far,
    each a request object's bytes. ``count``: requests completed. A request over ``max_request_bytes`` is a 413."""

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes
        self.count = 0
        self._state = "opening"  # opening, between (requests), request, closing, closed
        self._buffer = bytearray()
        self._depth = 0
        self._in_string = False
        self._escaped = False  # a backslash ended the last chunk inside a string
        self._comma = False  # a comma was read after the last request

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        pos = 0
        if self._state == "opening":
            self._buffer += chunk
            match = _OPENING.match(self._buffer)
            if match is None:
                if len(self._buffer) > MAX_OPENING_BYTES:
                    raise invalid(SHAPE, param="requests")
                return out
            chunk, self._buffer, self._state = bytes(self._buffer[match.end() :]), bytearray(), "between"
        while pos < len(chunk):
            if self._state == "request":
                pos = self._scan(chunk, pos, out)
            else:
                pos = self._punctuation(chunk, pos)
        return out

    def end(self) -> list[bytes]:
        if self._state != "closed":
            raise invalid(f"The body ended before its requests did. {SHAPE}", param="requests")
        return []

    def _punctuation(self, chunk: bytes, pos: int) -> int:
        """One byte between requests, or after the array."""
        byte = chunk[pos : pos + 1]
        if byte and byte in _WHITESPACE:
            return pos + 1
        if self._state == "between":
            expect_request = self.count == 0 or self._comma
            if byte == b"{" and expect_request:
                self._state, self._depth, self._comma = "request", 0, False
                return pos  # the request's scan takes its opening brace
            if byte == b"," and not expect_request:
                self._comma = True
                return pos + 1
            if byte == b"]" and not self._comma:
                self._state = "closing"
                return pos + 1
            raise invalid(f"requests[{self.count}] must be an object. {SHAPE}", param=f"requests[{self.count}]")
        if self._state == "closing" and byte == b"}":
            self._state = "closed"
            return pos + 1
        raise invalid(f"Nothing may follow the requests array. {SHAPE}", param="requests")

    def _scan(self, chunk: bytes, pos: int, out: list[bytes]) -> int:
        """Scan a request's bytes from ``pos`` to its closing brace (then emit it) or the chunk's end."""
        start = pos
        if self._escaped:
            pos, self._escaped = pos + 1, False
        while pos < len(chunk):
            if self._in_string:
                match = _IN_STRING.search(chunk, pos)
                if match is None:
                    pos = len(chunk)
                elif match[0] == b"\\":
                    pos = match.end() + 1
                    self._escaped = pos > len(chunk)
                else:
                    pos, self._in_string = match.end(), False
                continue
            match = _STRUCTURE.search(chunk, pos)
            if match is None:
                pos = len(chunk)
                continue
            pos, token = match.end(), match[0]
            if token == b'"':
                self._in_string = True
            elif token in b"{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    self._take(chunk[start:pos])
                    out.append(bytes(self._buffer))
                    self._buffer.clear()
                    self._state = "between"
                    self.count += 1
                    return pos
        self._take(chunk[start : min(pos, len(chunk))])
        return len(chunk)

    def _take(self, piece: bytes) -> None:
        self._buffer += piece
        if len(self._buffer) > self.max_request_bytes:
            raise ApiError(
                413,
                f"requests[{self.count}] is larger than the limit of {self.max_request_bytes} bytes",
                param=f"requests[{self.count}]",
                code=ErrorCode.REQUEST_TOO_LARGE,
            )


def input_line(index: int, request: bytes) -> bytes:
    """Request ``index`` of the body as an input line of the batch engine (its custom_id checked there)."""
    try:
        entry = msgspec.json.decode(request, type=_Request)
    except msgspec.ValidationError as exc:
        raise invalid(f"requests[{index}]: {exc}. {SHAPE}", param=f"requests[{index}]") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid(f"requests[{index}] is not valid JSON: {exc}", param=f"requests[{index}]") from None
    line = {"custom_id": entry.custom_id, "method": "POST", "url": jobs.MESSAGES_ENDPOINT}
    if entry.params:
        line["body"] = entry.params
    return msgspec.json.encode(line)

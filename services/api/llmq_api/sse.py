"""What every Server-Sent Events stream of the edge shares, whatever its dialect: the JSON of a ``data:`` line, and
the keep-alive comments of a silent stream.

A JSON encoder writes U+2028, U+2029 and U+0085 raw, as JSON allows; but clients that split an event stream by
universal newlines (httpx's ``iter_lines``, Python's ``str.splitlines``) cut an event there and cannot decode either
half. So the edge escapes them in every JSON it streams: in valid UTF-8 their bytes occur only as those characters, and
JSON's structure is ASCII, so each one found is inside a string, where ``\\uXXXX`` means the same character.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import msgspec

_encode = msgspec.json.encode
# UTF-8 of the line separators JSON leaves raw -> their JSON escapes
KEEP_ALIVE_COMMENT = b": keep-alive\n\n"  # an SSE comment: every client ignores it, every proxy sees bytes flow
_SEPARATORS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def data_json(payload: object) -> bytes:
    """``payload`` as JSON for one ``data:`` line: no byte of it ends a line for any line splitter."""
    data = _encode(payload)
    for raw, escaped in _SEPARATORS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


class KeepAlive:
    """Writes :data:`KEEP_ALIVE_COMMENT` through ``write`` whenever the stream has written nothing for ``interval_s``
    (a long prompt's prefill is silent for tens of seconds, past a load balancer's idle timeout). One loop timer per
    stream, re-armed once per interval; a comment's write is a task only when one is due. Call :meth:`wrote` after
    each write, and :meth:`stop` before the stream's last one."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]], interval_s: float) -> None:
        self._write = write
        self._interval_s = interval_s
        self._loop = asyncio.get_running_loop()
        self._last_s = self._loop.time()
        self._ping: asyncio.Task | None = None
        self._timer = self._loop.call_later(interval_s, self._due)
        self.sent = 0

    def wrote(self) -> None:
        self._last_s = self._loop.time()

    def _due(self) -> None:
        now_s = self._loop.time()
        due_s = self._last_s + self._interval_s
        if now_s >= due_s:
            if self._ping is None or self._ping.done():  # else the last one is still being written: it counts
                self._ping = self._loop.create_task(self._write(KEEP_ALIVE_COMMENT))
                self._ping.add_done_callback(_retrieve)
                self.sent += 1
            self._last_s, due_s = now_s, now_s + self._interval_s
        self._timer = self._loop.call_later(due_s - now_s, self._due)

    async def stop(self) -> None:
        """No comment after this returns: the timer is off and a comment being written is cancelled."""
        self._timer.cancel()
        if self._ping is not None and not self._ping.done():
            self._ping.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ping


def _retrieve(task: asyncio.Task) -> None:
    """A comment's write that failed (the client left): the stream's own wait sees that; nothing to report."""
    if not task.cancelled():
        task.exception()

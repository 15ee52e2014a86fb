"""The pod's waiters: request_id -> the HTTP exchange waiting for that request's chunks and its one resolution.

A waiter is resolved exactly once, by whichever comes first: the request's FinalResult, its deadline, or its client
leaving (see :meth:`WaiterRegistry.resolve`). Messages for unknown or already resolved requests are dropped; messages
for a request held here that name another tenant are forgeries (only llmq's own services may publish on a pod's
channel, so one that does is not one of them): dropped too, and counted apart.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

import msgspec

from llmq_core import wire


@dataclass(frozen=True, slots=True)
class DeadlineExceeded:
    """The request's deadline passed before its result arrived."""


@dataclass(frozen=True, slots=True)
class Abandoned:
    """Nobody waits any more; ``reason`` becomes the Cancel's reason (e.g. ``client_disconnected``)."""

    reason: str


Resolution = wire.FinalResult | DeadlineExceeded | Abandoned
Event = wire.TokenChunk | Resolution


class Dispatched(enum.Enum):
    """What became of a reply handed to :meth:`WaiterRegistry.dispatch`; true only when it reached its waiter."""

    DELIVERED = "delivered"
    DROPPED = "dropped"  # an unknown or finished request, or a chunk out of order or of another attempt
    FORGED = "forged"  # a request held here, but for another tenant than it names

    def __bool__(self) -> bool:
        return self is Dispatched.DELIVERED


class DuplicateRequestError(Exception):
    """A waiter for this request_id is already registered."""


class Waiter:
    """One request's mailbox: TokenChunks (streaming only), then its resolution.

    Chunks pass in order (``seq`` 0, 1, 2...) and of one generation: an attempt's, or a run that continues it (its
    worker was lost: another, or the same one restarted, continued from the tokens generated, see
    ``llmq_core.continuation``). A continuing run starts at seq 0, of the same or a later attempt, and its chunks carry
    their ``offset`` in the choice's text: what the client already has of it is cut off (it must be the same text),
    the rest passes; chunks of an older attempt are dropped.
    A repeat or a gap, a later attempt without offsets, or text that is not the client's stops all later chunks: the
    rest of the text may come only from the FinalResult, and only if it extends what the client got (see
    ``responses.StreamResponse``)."""

    def __init__(self, request_id: str, stream: bool, tenant_id: str | None = None) -> None:
        """``tenant_id``: whose request this is (replies naming another are forgeries); None: not checked."""
        self.request_id = request_id
        self.stream = stream
        self.tenant_id = tenant_id
        self.resolution: Resolution | None = None
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._last_seq = -1
        self.attempt: int | None = None  # of the chunks that passed
        self._sealed = False
        self._texts: dict[int, list[str]] = {}  # choice index -> the pieces of text passed (to join a continuing run)
        self._chars: dict[int, int] = {}  # choice index -> characters passed

    @property
    def done(self) -> bool:
        return self.resolution is not None

    async def next_event(self) -> Event:
        """The next chunk, or the resolution (always the last event: stop reading after it)."""
        return await self._events.get()

    def offer(self, chunk: wire.TokenChunk) -> bool:
        """Pass ``chunk`` to an unregistered waiter (a stream replayed from its log); whether it passed."""
        return self._push_chunk(chunk)

    def _push_chunk(self, chunk: wire.TokenChunk) -> bool:
        if not self.stream or self.done or self._sealed:
            return False
        if self.attempt is not None and chunk.attempt < self.attempt:
            return False  # a lost attempt's late chunk: its continuation is streaming
        if self.attempt is not None and chunk.attempt >= self.attempt and chunk.seq == 0 and chunk.offset >= 0:
            self._last_seq = -1  # a continuation starts (the same attempt's: its worker was restarted)
        elif chunk.seq != self._last_seq + 1 or (self.attempt is not None and chunk.attempt != self.attempt):
            self._sealed = self.attempt is not None
            return False
        self.attempt = chunk.attempt
        self._last_seq = chunk.seq
        text = self._new_text(chunk)
        if text is None:
            self._sealed = True
            return False
        if text:
            self._texts.setdefault(chunk.index, []).append(text)
            self._chars[chunk.index] = self._chars.get(chunk.index, 0) + len(text)
            trimmed = len(text) < len(chunk.text)
            self._events.put_nowait(msgspec.structs.replace(chunk, text=text) if trimmed else chunk)
        return True

    def _new_text(self, chunk: wire.TokenChunk) -> str | None:
        """What ``chunk`` adds to the text its choice passed ("" if nothing); None when it contradicts that text or
        leaves a gap after it. A chunk without an offset follows the last."""
        known = self._chars.get(chunk.index, 0) - chunk.offset
        if chunk.offset < 0 or known == 0:
            return chunk.text
        if known < 0:
            return None
        have = "".join(self._texts[chunk.index])  # a continuing run's first chunks only: they restate text passed
        return chunk.text[known:] if have.startswith(chunk.text[:known], chunk.offset) else None

    def _resolve(self, resolution: Resolution) -> None:
        self.resolution = resolution
        self._events.put_nowait(resolution)


class WaiterRegistry:
    """All waiters of this pod, at most ``max_waiters`` at once. Not thread-safe: use from the event loop only."""

    def __init__(self, max_waiters: int) -> None:
        self.max_waiters = max_waiters
        self._waiters: dict[str, Waiter] = {}
        self.dropped = 0  # messages for unknown or finished requests
        self.forged = 0  # messages for a request held here that name another tenant

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._waiters

    @property
    def full(self) -> bool:
        return len(self._waiters) >= self.max_waiters

    def request_ids(self) -> list[str]:
        return list(self._waiters)

    def register(self, request_id: str, stream: bool, tenant_id: str | None = None) -> Waiter:
        """A new waiter for ``tenant_id``'s request; register it BEFORE the request is produced so no reply can
        outrun it.

        Raises :class:`DuplicateRequestError` for a request_id already waited for.
        """
        if request_id in self._waiters:
            raise DuplicateRequestError(request_id)
        waiter = self._waiters[request_id] = Waiter(request_id, stream, tenant_id)
        return waiter

    def dispatch(self, message: wire.TokenChunk | wire.FinalResult) -> Dispatched:
        """Route a reply to its waiter; counts what it drops (see :class:`Dispatched`)."""
        waiter = self._waiters.get(message.request_id)
        if waiter is not None and waiter.tenant_id is not None and message.tenant_id != waiter.tenant_id:
            self.forged += 1
            return Dispatched.FORGED
        if waiter is not None:
            if isinstance(message, wire.FinalResult):
                self.resolve(waiter, message)
                return Dispatched.DELIVERED
            if waiter._push_chunk(message):
                return Dispatched.DELIVERED
        self.dropped += 1
        return Dispatched.DROPPED

    def resolve(self, waiter: Waiter, resolution: Resolution) -> Resolution:
        """Resolve ``waiter`` unless it already is; returns the resolution that holds (the first one)."""
        if waiter.resolution is None:
            waiter._resolve(resolution)
            if self._waiters.get(waiter.request_id) is waiter:
                del self._waiters[waiter.request_id]
        return waiter.resolution

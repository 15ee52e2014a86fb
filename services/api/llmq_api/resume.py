"""Resumable streams at the edge (see ``llmq_core.stream_log``): who holds one, and when its leaving cancels it.

A stream sent with an ``Idempotency-Key`` is held by the connection that last took it: its first one, or the latest
that resumed it (a request with that key to any pod, which writes the stream's holder key). When the holder's client
leaves, the stream keeps running for ``api.stream_resume_window_ms``; then, unless another connection holds it by then
or it has ended, it is cancelled and its key released, as any stream is at once. Its deadline cancels it at once; its pod's shutdown or
death leaves the cancel to the batchers, which count the window from the pod's going (``llmq_batcher.pods``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from llmq_api.exchange import CLIENT_GONE_REASON, SHUTDOWN_REASON, CancelPublisher
from llmq_core.clock import Sleep
from llmq_core.constants import result_key, stream_holder_key
from llmq_core.stream_log import holder_value

log = logging.getLogger(__name__)

FIRST = ""  # the token of a stream's first connection: it writes no holder key


class StreamHolds:
    """The holds of pod ``instance_id``'s resumable streams; ``publish_cancel``: how a Cancel goes out."""

    def __init__(
        self,
        redis: Redis,
        instance_id: str,
        window_ms: int,
        publish_cancel: CancelPublisher,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """``sleep`` waits out the window (tests pass one they drive)."""
        self._redis = redis
        self._instance_id = instance_id
        self.window_ms = window_ms
        self._publish_cancel = publish_cancel
        self._sleep = sleep
        self._waits: set[asyncio.Task] = set()

    async def take(self, request_id: str, ttl_ms: int) -> str:
        """Hold ``request_id``'s stream for a connection resuming it (for ``ttl_ms``, its life); returns its token."""
        token = uuid.uuid4().hex
        await self._redis.set(stream_holder_key(request_id), holder_value(self._instance_id, token), px=max(ttl_ms, 1))
        return token

    def canceller(self, token: str, release: Callable[[], Awaitable[None]]) -> CancelPublisher:
        """The CancelPublisher of the connection holding with ``token`` (:data:`FIRST` for the first): its client's
        leaving waits out the window, its deadline cancels at once, its pod's shutdown leaves it to the batchers;
        ``release`` drops the stream's Idempotency-Key claim once it is cancelled."""

        async def cancel(request_id: str, reason: str) -> None:
            if reason == SHUTDOWN_REASON:
                return
            if reason != CLIENT_GONE_REASON:
                await self._cancel(request_id, reason, release)
                return
            wait = asyncio.create_task(self._cancel_unless_resumed(request_id, token, release))
            self._waits.add(wait)
            wait.add_done_callback(self._waits.discard)

        return cancel

    async def _cancel_unless_resumed(self, request_id: str, token: str, release: Callable[[], Awaitable[None]]) -> None:
        await self._sleep(self.window_ms / 1000)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(stream_holder_key(request_id))
                pipe.exists(result_key(request_id))
                holder, ended = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - cancel rather than leave it running for no one
            log.warning("reading the holder of stream %s failed: %r", request_id, exc, extra={"request_id": request_id})
            holder, ended = None, False
        ours = holder_value(self._instance_id, token).encode() if token != FIRST else None
        if holder == ours and not ended:  # an ended one keeps its key: a retry gets its stored result
            await self._cancel(request_id, CLIENT_GONE_REASON, release)

    async def _cancel(self, request_id: str, reason: str, release: Callable[[], Awaitable[None]]) -> None:
        await self._publish_cancel(request_id, reason)
        await release()

    async def stop(self) -> None:
        """Stop waiting out windows (the pod is going: the batchers cancel what no one resumes)."""
        waits = list(self._waits)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)

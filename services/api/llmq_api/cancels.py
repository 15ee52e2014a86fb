"""The Cancels an API pod publishes for requests it gave up on (deadline passed, client gone, produce failed).

A lost Cancel is work done for a caller who left. Under a flood of 3,000 requests a pod logged 17 ``publishing cancel
... failed: MaxConnectionsError``: each Cancel was a PUBLISH through the pod's shared client, whose pool (redis-py's
100 connections) every other request's Redis call was holding. So :class:`CancelSender` takes Cancels into a bounded
queue (the request path never waits on Redis for them) and one task publishes them, pipelined up to GROUP per round
trip, on a client of its own: a Cancel that fails stays queued and is tried again. The task lives only while there is
something to send, and :meth:`CancelSender.stop` ends it: what it could not send by then is dropped and counted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from redis.asyncio import Redis

from llmq_api.metrics import ApiMetrics
from llmq_core import runtime, wire

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 1.0  # one pipelined group
GROUP = 256  # Cancels per round trip
RETRY_S = 0.05  # after a failed group, before the next try (doubling up to RETRY_MAX_S)
RETRY_MAX_S = 1.0


class CancelSender:
    """Publishes Cancels on ``channel`` through ``redis``, a client only this sender uses (so a busy pool elsewhere
    never refuses it a connection). ``max_queued`` bounds the queue (Redis down for long): past it a new Cancel is
    dropped, counted in ``llmq_api_cancels_dropped_total``; so is what is left at :meth:`stop`."""

    def __init__(self, redis: Redis, channel: str, metrics: ApiMetrics, max_queued: int) -> None:
        self.redis = redis
        self.channel = channel
        self.metrics = metrics
        self.max_queued = max(1, max_queued)
        self._queue: collections.deque[wire.Cancel] = collections.deque()
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    async def publish(self, request_id: str, reason: str) -> None:
        """The pod's CancelPublisher: :meth:`send` (it returns at once)."""
        self.send(request_id, reason)

    def send(self, request_id: str, reason: str) -> None:
        """Queue a Cancel of ``request_id``; it goes out as soon as Redis takes it. Never blocks or raises."""
        cancel = wire.Cancel(request_id=request_id, reason=reason)
        if self._stopping.is_set() or len(self._queue) >= self.max_queued:
            self._dropped([cancel], "the pod stopped" if self._stopping.is_set() else "the queue is full")
            return
        self._queue.append(cancel)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def stop(self, bound_s: float) -> None:
        """Send what is queued within ``bound_s`` (a group that failed gets one more try, at once), then end the task;
        what is left is dropped (counted). Later Cancels are dropped too. Never raises."""
        self._stopping.set()
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=bound_s)
            await runtime.cancel_and_wait([task])  # a cancel redis-py swallows is sent again
        if self._queue:
            left, self._queue = list(self._queue), collections.deque()
            self._dropped(left, "unsent when the pod stopped")

    async def _drain(self) -> None:
        """Publish until the queue is empty; a failed group is kept and tried again after a backoff (which a stop cuts
        short: one more try then, and no other)."""
        backoff_s = RETRY_S
        while self._queue:
            try:
                await self._publish_group()
                backoff_s = RETRY_S
            except Exception as exc:  # Redis down, slow or restarting: keep them
                if self._stopping.is_set():
                    return  # stop() counts what is left
                log.warning("publishing %d cancels failed (%r); trying again", len(self._queue), exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff_s):
                        await self._stopping.wait()
                backoff_s = min(RETRY_MAX_S, backoff_s * 2)

    async def _publish_group(self) -> None:
        group = [self._queue[i] for i in range(min(GROUP, len(self._queue)))]
        async with asyncio.timeout(PUBLISH_TIMEOUT_S):
            async with self.redis.pipeline(transaction=False) as pipe:
                for cancel in group:
                    pipe.publish(self.channel, wire.encode(cancel))
                await pipe.execute()
        for cancel in group:  # sent: only now do they leave the queue (send() appends behind them meanwhile)
            self._queue.popleft()
            self.metrics.cancels.labels(cancel.reason).inc()

    def _dropped(self, cancels: list[wire.Cancel], why: str) -> None:
        for cancel in cancels:
            self.metrics.cancels_dropped.labels(cancel.reason).inc()
        log.warning(
            "dropped %d cancels (%s), the first of %s",
            len(cancels),
            why,
            cancels[0].request_id,
            extra={"request_id": cancels[0].request_id},
        )

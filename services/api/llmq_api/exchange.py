"""One request's wait, from the moment it was produced until its single resolution.

The waiter is resolved by the first of: its FinalResult (dispatched by the reply reader), its deadline, its client
leaving, or the wait itself being cancelled (pod shutdown). When the pod gave up (deadline, client gone, shutdown) it
publishes a Cancel so the batcher and workers drop the work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmq_api.waiters import Abandoned, DeadlineExceeded, Resolution, Waiter, WaiterRegistry
from llmq_core import wire

log = logging.getLogger(__name__)

CancelPublisher = Callable[[str, str], Awaitable[None]]  # (request_id, reason); best effort, never raises
ChunkSink = Callable[[wire.TokenChunk], Awaitable[None]]

DEADLINE_REASON = "deadline_exceeded"
CLIENT_GONE_REASON = "client_disconnected"
SHUTDOWN_REASON = "pod_shutdown"


async def wait_for_resolution(
    registry: WaiterRegistry,
    waiter: Waiter,
    *,
    deadline: Awaitable[None],
    client_gone: Awaitable[None],
    publish_cancel: CancelPublisher,
    on_chunk: ChunkSink | None = None,
) -> Resolution:
    """Pass the waiter's chunks to ``on_chunk`` until it is resolved; return the resolution.

    ``deadline`` and ``client_gone`` are awaitables that complete when the deadline passes / the client leaves (e.g.
    ``asyncio.sleep(remaining_s)`` and a disconnect watcher); both are cancelled once the waiter is resolved. Cancelling
    this coroutine resolves the waiter as abandoned (and publishes the Cancel) before re-raising.
    """
    triggers = [
        _on_completion(deadline, registry, waiter, DeadlineExceeded()),
        _on_completion(client_gone, registry, waiter, Abandoned(CLIENT_GONE_REASON)),
    ]
    fallback = Abandoned(SHUTDOWN_REASON)  # used only when this wait ends without a resolution
    try:
        while True:
            event = await waiter.next_event()
            if not isinstance(event, wire.TokenChunk):
                return event
            if on_chunk is not None:
                await on_chunk(event)
    except asyncio.CancelledError:
        raise
    except Exception:
        fallback = Abandoned(CLIENT_GONE_REASON)  # writing to the client failed
        raise
    finally:
        for trigger in triggers:
            trigger.cancel()
        resolution = registry.resolve(waiter, fallback)
        await _cancel_if_given_up(waiter.request_id, resolution, publish_cancel)


def _on_completion(
    trigger: Awaitable[None], registry: WaiterRegistry, waiter: Waiter, resolution: Resolution
) -> asyncio.Future:
    """Run ``trigger``; once it completes (or fails: a broken connection) resolve the waiter with ``resolution``."""
    future = asyncio.ensure_future(trigger)

    def fire(done: asyncio.Future) -> None:
        if not done.cancelled():
            done.exception()  # retrieved: a failed trigger counts as fired
            registry.resolve(waiter, resolution)

    future.add_done_callback(fire)
    return future


async def _cancel_if_given_up(request_id: str, resolution: Resolution, publish_cancel: CancelPublisher) -> None:
    if isinstance(resolution, DeadlineExceeded):
        await publish_cancel(request_id, DEADLINE_REASON)
    elif isinstance(resolution, Abandoned):
        await publish_cancel(request_id, resolution.reason)

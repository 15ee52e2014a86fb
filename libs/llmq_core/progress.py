"""Reading the Progress frames workers write at ``constants.progress_key`` (see :mod:`llmq_core.continuation`): the
batchers read them to continue a request of a lost worker, a restarted worker to continue the streams it had."""

from __future__ import annotations

import msgspec
from redis.asyncio import Redis

from llmq_core import constants, wire


async def read(redis: Redis, request_ids: list[str]) -> dict[str, list[wire.Progress]]:
    """The Progress frames at ``constants.progress_key`` of each of ``request_ids`` (undecodable ones left out)."""
    async with redis.pipeline(transaction=False) as pipe:
        for request_id in request_ids:
            pipe.lrange(constants.progress_key(request_id), 0, -1)
        lists = await pipe.execute()
    frames: dict[str, list[wire.Progress]] = {}
    for request_id, values in zip(request_ids, lists, strict=True):
        decoded = [_frame(value) for value in values or ()]
        frames[request_id] = [frame for frame in decoded if frame is not None]
    return frames


def _frame(value: bytes) -> wire.Progress | None:
    try:
        frame = wire.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return frame if isinstance(frame, wire.Progress) else None

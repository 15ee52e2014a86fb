"""What a worker reads before it runs a batch: the StreamMarks of its streams, and the progress of those its previous
process had sent text of (it was killed mid-stream), so that they continue instead of ending ``stream_interrupted``
(docs/workers.md#continuation)."""

from __future__ import annotations

import logging

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from llmq_core import continuation, progress, wire
from llmq_core.constants import streamed_key
from llmq_worker.answers import streams

log = logging.getLogger(__name__)


async def stream_marks(redis: Redis, batch: wire.Batch) -> dict[str, wire.StreamMark]:
    """The StreamMarks of the batch's streaming requests, in one round trip (none without Redis: the API pod still
    never mixes two generations, it ends such a stream with an error instead)."""
    ids = [r.request_id for r in batch.requests if streams(r)]
    if not ids:
        return {}
    try:
        values = await redis.mget([streamed_key(i) for i in ids])
    except (RedisError, OSError) as exc:
        log.warning("reading stream marks failed (%r): running the batch without them", exc)
        return {}
    marks = {}
    for request_id, value in zip(ids, values):
        try:
            mark = wire.decode(value) if value is not None else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            mark = None
        if isinstance(mark, wire.StreamMark):
            marks[request_id] = mark
    return marks


async def continued(redis: Redis, batch: wire.Batch, marks: dict[str, wire.StreamMark], max_hops: int) -> wire.Batch:
    """``batch`` with each stream whose text reached its caller in this attempt (its mark: this worker's previous
    process was killed while it streamed) carrying the tokens that process generated
    (:func:`llmq_core.continuation.continued`): the stream continues instead of ending ``stream_interrupted``."""
    ids = [r.request_id for r in batch.requests if _streamed_here(r, marks.get(r.request_id))]
    if not ids:
        return batch
    try:
        frames = await progress.read(redis, ids)
    except (RedisError, OSError) as exc:
        log.warning("reading the progress of %d streams failed (%r): they end interrupted", len(ids), exc)
        return batch
    requests = [
        continuation.continued(r, frames[r.request_id], max_hops) if r.request_id in frames else r
        for r in batch.requests
    ]
    return msgspec.structs.replace(batch, requests=requests)


def _streamed_here(request: wire.GenerationRequest, mark: wire.StreamMark | None) -> bool:
    """Whether ``mark`` says this attempt of ``request`` sent text and has no result out yet."""
    return mark is not None and not mark.done and mark.attempt == request.attempt

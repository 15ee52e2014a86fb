"""From a lost attempt's progress to the next attempt's :class:`~llmq_core.wire.Continuation` (pure).

A worker RPUSHes :class:`~llmq_core.wire.Progress` frames at ``constants.progress_key(request_id)``: a stream's with
each chunk, before the chunk is published (so they hold at least the text its caller got), the others' every
``worker.progress_interval_ms`` (a non-streamed continuation may recompute that much). A continued attempt first
writes its continuation's tokens as its own frames (``start`` 0), so the frames of the newest attempt that wrote any
are the whole generation so far; a lost worker's frames that arrive late (it was cut off, not dead) are older and
left out.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from llmq_core import wire
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, RECORD_HEADROOM_BYTES

MAX_REQUEST_RECORD_BYTES = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES  # a continued request, encoded, at most


def generated(frames: Iterable[wire.Progress], n: int) -> tuple[int, list[list[int]]] | None:
    """The newest attempt among ``frames`` (in RPUSH order) and each of its ``n`` choices' token ids; None: no frame.

    A frame starting before its choice's end replaces the ids from its start (a worker re-sends nothing, but a
    continuation's first frames restate what it was given); one starting past the end leaves a gap, so that choice
    keeps only the ids before it."""
    frames = list(frames)
    if not frames:
        return None
    attempt = max(frame.attempt for frame in frames)
    ids: list[list[int]] = [[] for _ in range(n)]
    cut = [False] * n
    for frame in frames:
        if frame.attempt != attempt or frame.index >= n or cut[frame.index]:
            continue
        held = ids[frame.index]
        if frame.start > len(held):
            cut[frame.index] = True
            continue
        ids[frame.index] = held[: frame.start] + frame.token_ids
    return attempt, ids


def continued(
    request: wire.GenerationRequest, frames: Iterable[wire.Progress], max_hops: int
) -> wire.GenerationRequest:
    """``request`` (a re-dispatch: its earlier attempts may have generated tokens) with the Continuation its progress
    ``frames`` make, or as it is (run from its start) when there is none to make: no frame or no token, its
    continuations already ``max_hops`` (0: continuation off), constrained decoding or logprobs asked (their state
    does not cross a seam: the grammar's and the entries of the tokens before it), or a record past
    MAX_REQUEST_RECORD_BYTES with it. A stream whose text reached its caller and that is not continued is answered
    ``stream_interrupted`` by the worker that takes it."""
    if not resumable(request):
        return _plain(request)
    found = generated(frames, request.sampling.n)
    if found is None or not any(found[1]):
        return _plain(request)
    attempt, token_ids = found
    hops = _hops(request.continuation, attempt)
    if hops > max_hops:
        return _plain(request)
    continuation = wire.Continuation(token_ids=token_ids, hops=hops, from_attempt=attempt)
    out = msgspec.structs.replace(request, continuation=continuation)
    return out if len(wire.encode(out)) <= MAX_REQUEST_RECORD_BYTES else _plain(request)


def resumable(request: wire.GenerationRequest) -> bool:
    """Whether ``request`` can continue across a seam: not with constrained decoding or logprobs asked (the grammar's
    state and the entries of the tokens before it do not cross one)."""
    return request.structured is None and request.sampling.logprobs is None


def _hops(earlier: wire.Continuation | None, attempt: int) -> int:
    """Seams in a continuation from ``attempt``'s tokens: one more than ``earlier``'s, unless ``earlier`` came from
    the same attempt (the same seam: a batch whose produce failed is dispatched again)."""
    if earlier is None:
        return 1
    return earlier.hops if earlier.from_attempt == attempt else earlier.hops + 1


def _plain(request: wire.GenerationRequest) -> wire.GenerationRequest:
    """``request`` without a continuation (an earlier one's tokens would be stale: the frames are newer)."""
    return request if request.continuation is None else msgspec.structs.replace(request, continuation=None)

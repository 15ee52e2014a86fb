"""Cutting a job into shards that fit the target's batch limits (requests and bytes, whichever binds first). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# OpenAI's Batch API: 50,000 requests and 200 MB per input file; used when the target does not say its own.
OPENAI_MAX_REQUESTS = 50_000
OPENAI_MAX_FILE_BYTES = 200 * 1024 * 1024
SAFETY_MARGIN = 0.05  # shards stay this share below the target's limits: an oversized batch is refused whole


@dataclass(frozen=True, slots=True)
class ShardLimits:
    """A shard's bounds: requests and bytes of its file; ``max_line_bytes``: the target's bound on one line (its bytes
    without the newline), None when the target does not say (OpenAI's)."""

    max_requests: int
    max_bytes: int
    max_line_bytes: int | None = None


def shard_limits(
    target: ShardLimits | None, max_requests: int | None, max_bytes: int | None, margin: float = SAFETY_MARGIN
) -> ShardLimits:
    """Each shard limit: the flag when given (used as is), else the target's (OpenAI's when it says none) less the
    margin; the line limit is the target's, exact (a line's size is counted exactly)."""
    target = target or ShardLimits(OPENAI_MAX_REQUESTS, OPENAI_MAX_FILE_BYTES)
    return ShardLimits(
        max_requests or max(1, math.floor(target.max_requests * (1 - margin))),
        max_bytes or max(1, math.floor(target.max_bytes * (1 - margin))),
        target.max_line_bytes,
    )


def retry_limits(limits: ShardLimits, round_: int) -> ShardLimits:
    """Retry round r cuts shards at most 1/2**r of the first round's: a shard too big for its window gets smaller."""
    return ShardLimits(max(1, limits.max_requests >> round_), max(1, limits.max_bytes >> round_), limits.max_line_bytes)


def too_large(size: int, limits: ShardLimits) -> str | None:
    """Why a line of ``size`` upload bytes (its newline included) can never be uploaded within ``limits`` (the
    first round's); None when it can."""
    if limits.max_line_bytes is not None and size - 1 > limits.max_line_bytes:
        return f"the line is {size - 1} bytes; the target takes at most {limits.max_line_bytes} bytes per line"
    if size > limits.max_bytes:
        return f"the line is {size} bytes with its newline; a shard file may hold at most {limits.max_bytes} bytes"
    return None


def plan(sizes: Sequence[tuple[str, int]], limits: ShardLimits) -> list[list[str]]:
    """Shards of ``(custom_id, upload bytes)`` in order, each within both limits, but a line that alone exceeds the
    byte limit: it gets a shard of its own (a retry round's halved limits do that to a line that fit the first
    round's; lines that fit no shard at all are kept out before planning: :func:`too_large`)."""
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for custom_id, size in sizes:
        if current and (len(current) == limits.max_requests or used + size > limits.max_bytes):
            shards.append(current)
            current, used = [], 0
        current.append(custom_id)
        used += size
    if current:
        shards.append(current)
    return shards

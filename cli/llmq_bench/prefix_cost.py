"""What the batcher's prefix hashing costs per request: :func:`llmq_core.prefixes.request_chain` (a blake2b per
PREFIX_BLOCK_BYTES of prompt, at most PREFIX_MAX_BLOCKS) on given prompts, in CPU microseconds, beside the batcher's
whole CPU per request. A batcher hashes a request once per cache scope its model's workers use (one, unless some share
their cache across tenants and others do not), when it first routes or dispatches it (llmq_batcher.prefix_route).

``llmq bench scale`` reports it on the prompts it sent (``prefix_hash`` in its JSON); ``bench/prefix_hash.py`` on
prompts of 1, 2 and 4 KiB.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from llmq_core import wire
from llmq_core.prefixes import prompt_bytes, request_chain

_REPLY = wire.HttpReply(instance_id="bench")


def hash_cost(prompts: Sequence[str], *, repeats: int = 5, timer: Callable[[], float] = time.process_time) -> dict:
    """CPU per request of hashing each of ``prompts`` (non-empty) as a completions request, the best of ``repeats``
    passes (``timer``: seconds of CPU): {requests, prompt_bytes_mean, blocks_mean, us_per_request}."""
    requests = [
        wire.GenerationRequest(
            request_id=str(i), model="llmq-sim", prompt=p, created_ms=0, deadline_ms=1, reply_to=_REPLY
        )
        for i, p in enumerate(prompts)
    ]
    best_s = float("inf")
    for _ in range(repeats):
        start = timer()
        chains = [request_chain(r, True) for r in requests]
        best_s = min(best_s, timer() - start)
    return {
        "requests": len(requests),
        "prompt_bytes_mean": round(sum(len(prompt_bytes(r)) for r in requests) / len(requests), 1),
        "blocks_mean": round(sum(map(len, chains)) / len(requests), 2),
        "us_per_request": round(best_s * 1e6 / len(requests), 2),
    }


def share_of(cost: dict, batcher_ms_per_request: float | None) -> float | None:
    """The hashing's share of a batcher's CPU per request (None: that is not known)."""
    if not batcher_ms_per_request:
        return None
    return round(cost["us_per_request"] / 1000 / batcher_ms_per_request, 4)

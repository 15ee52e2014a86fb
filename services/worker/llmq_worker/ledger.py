"""The worker's side of the fleet's capacity ledger (llmq_batcher.ledger has the rule, llmq_batcher.capacity the
batchers' claims): what the worker holds, written each time it changes, and the grant of each batch it takes removed
(that batch's requests are then counted as queued here, no longer in transit), and how many running deferred sequences
the worker would preempt (batches without deferred requests may claim that room too)."""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from llmq_core import wire
from llmq_core.names import Names

log = logging.getLogger(__name__)

LEDGER_TTL_MS = 30_000  # a gone worker's ledger outlives its heartbeats (batchers stop choosing it first)


class LedgerWriter:
    """Writes ``names.capacity_keys(worker_id)``."""

    def __init__(self, redis: Redis, names: Names, worker_id: str) -> None:
        self._redis = redis
        self._ledger_key, self._grants_key = names.capacity_keys(worker_id)

    async def write(self, beat: wire.WorkerHeartbeat, window_end_ms: int, took: str | None = None) -> None:
        """The worker holds what ``beat`` says (its running window ending at ``window_end_ms``: a fixed-time engine);
        ``took``: the batch it just took. Best effort: a failed write is logged (claims see the last one, and the
        grant of ``took`` stops counting after its TTL)."""
        fields = {
            "max_slots": beat.max_slots,
            "fixed": int(beat.fixed_batch_time_ms > 0),
            "batch_time_ms": beat.fixed_batch_time_ms,
            "running": beat.running,
            "queued": beat.queued,
            "preemptible": beat.preemptible,
        }
        if window_end_ms:
            fields["ends_ms"] = window_end_ms
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._ledger_key, mapping=fields)
                pipe.pexpire(self._ledger_key, LEDGER_TTL_MS)
                if took is not None:
                    pipe.hdel(self._grants_key, took)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("writing the capacity ledger failed: %r", exc)

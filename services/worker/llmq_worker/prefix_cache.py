"""What a worker's prefix cache holds, and the summaries it publishes of it for the batchers' prefix-aware dispatch.

:class:`PrefixLedger` keeps the prefix-chain hashes (``llmq_core.prefixes``) of the prompts the worker ran, least
recently used first, each weighing the prompt tokens of its block, within ``budget_tokens``. For the simulated engine it
is the cache itself (a hit is a block found here); for the transformers and vllm engines, whose caches key blocks by
token ids, it is the worker's account of what they keep (the same budget sizes both), so its summary can be approximate
the way llm-d's approximate prefix scorer is: a block it names may have been evicted, which costs affinity, never
correctness. :class:`PrefixReporter` publishes it every ``prefix_summary_interval_ms``.
"""

from __future__ import annotations

import collections
import logging

from llmq_core import prefixes, wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.settings import WorkerSettings

log = logging.getLogger(__name__)


class PrefixLedger:
    """Prefix blocks held, by chain hash, in least-recently-used order; ``tokens`` of them at most ``budget_tokens``."""

    def __init__(self, budget_tokens: int, tenant_scoped: bool = True) -> None:
        self.budget_tokens = budget_tokens
        self.tenant_scoped = tenant_scoped
        self.tokens = 0.0
        self._blocks: collections.OrderedDict[int, float] = collections.OrderedDict()  # hash -> tokens, oldest first

    @classmethod
    def from_settings(cls, worker: WorkerSettings) -> PrefixLedger | None:
        """The ledger ``worker``'s settings ask for (None: prefix caching is off)."""
        if not worker.prefix_cache:
            return None
        return cls(worker.prefix_cache_budget_tokens, worker.prefix_cache_scope == "tenant")

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, request: wire.GenerationRequest) -> tuple[int, ...]:
        """``request``'s prefix chain, salted as this cache is scoped."""
        return prefixes.request_chain(request, self.tenant_scoped)

    def match(self, chain: tuple[int, ...]) -> int:
        """Leading blocks of ``chain`` held (a lookup: recency changes only by :meth:`record`)."""
        return prefixes.matched_blocks(chain, self._blocks)

    def record(self, chain: tuple[int, ...], tokens_per_block: float) -> None:
        """A prompt with ``chain`` ran: its blocks become the most recently used (its first block last, so that a chain
        loses its tail before its head), then the least recently used go until the budget holds."""
        blocks = self._blocks
        for block in reversed(chain):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = tokens_per_block
                self.tokens += tokens_per_block
        while blocks and self.tokens > self.budget_tokens:
            self.tokens -= blocks.popitem(last=False)[1]

    def summary(self, max_blocks: int) -> list[int]:
        """The held hashes, most recently used first, at most ``max_blocks``."""
        held = []
        for block in reversed(self._blocks):
            if len(held) >= max_blocks:
                break
            held.append(block)
        return held


def tokens_per_block(request: wire.GenerationRequest, prompt_tokens: int) -> float:
    """Prompt tokens one PREFIX_BLOCK_BYTES block of ``request`` stands for (its prompt's tokens per byte)."""
    size = len(prefixes.prompt_bytes(request))
    return prompt_tokens * PREFIX_BLOCK_BYTES / size if size else 0.0


class PrefixReporter:
    """Publishes a worker's :class:`PrefixLedger` as a PrefixSummary on the heartbeats channel, at most every
    ``interval_ms`` and only once it holds something."""

    def __init__(
        self, ledger: PrefixLedger, *, worker_id: str, model: str, interval_ms: int, max_blocks: int, channel: str
    ) -> None:
        self._ledger = ledger
        self._worker_id, self._model = worker_id, model
        self._interval_ms, self._max_blocks = interval_ms, max_blocks
        self._channel = channel
        self._sent_ms: int | None = None

    def due(self, now_ms: int) -> wire.PrefixSummary | None:
        """The summary to publish at ``now_ms`` (None: not due, or nothing held yet)."""
        if not len(self._ledger) or (self._sent_ms is not None and now_ms - self._sent_ms < self._interval_ms):
            return None
        self._sent_ms = now_ms
        return wire.PrefixSummary(
            worker_id=self._worker_id,
            model=self._model,
            block_bytes=PREFIX_BLOCK_BYTES,
            tenant_scoped=self._ledger.tenant_scoped,
            blocks=self._ledger.summary(self._max_blocks),
            sent_ms=now_ms,
        )

    async def publish(self, redis, now_ms: int) -> None:
        """Publish the summary if due; a failed publish is logged and the next interval sends a fresh one."""
        summary = self.due(now_ms)
        if summary is None:
            return
        try:
            await redis.publish(self._channel, wire.encode(summary))
        except Exception:  # noqa: BLE001 - a lost summary costs affinity only
            log.exception("prefix summary failed")

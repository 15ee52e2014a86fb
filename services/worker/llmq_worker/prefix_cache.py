"""What a worker's prefix cache holds, and the summaries it publishes of it for the batchers' prefix-aware dispatch.

:class:`PrefixLedger` keeps the prefix-chain hashes (``llmq_core.prefixes``) of the prompts the worker ran, each
weighing the prompt tokens of its block, within ``budget_tokens``, evicted as a :class:`SegmentedLRU` (a block used again outlives the one-off tails of prompts). For the simulated engine it
is the cache itself (a hit is a block found here); for the transformers and vllm engines, whose caches key blocks by
token ids, it is the worker's account of what they keep (the same budget sizes both), so its summary can be approximate
the way llm-d's approximate prefix scorer is: a block it names may have been evicted, which costs affinity, never
correctness. :class:`PrefixReporter` publishes it every ``prefix_summary_interval_ms``.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Hashable, Iterable, Iterator

from llmq_core import prefixes, wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.settings import WorkerSettings

log = logging.getLogger(__name__)

# The share of a budget that blocks used more than once may hold. The rest is for blocks seen once, so that a new
# session's header can stay long enough to be used again.
PROTECTED_SHARE = 0.8


class SegmentedLRU:
    """Weighted keys in two least-recently-used segments (SLRU, as in Karedla et al. 1994): a new key enters
    *probation*; a key used again moves to *protected*, which holds at most PROTECTED_SHARE of ``budget`` (its least
    recently used fall back to probation's most recent end). Past ``budget``, probation's least recently used go first,
    then protected's. So the tails of one-off prompts (each seen once) go before a header that sessions share, which a
    plain LRU would let a run of tails push out between two turns of a session."""

    def __init__(self, budget: float, protected_share: float = PROTECTED_SHARE) -> None:
        self.budget = budget
        self.protected_budget = protected_share * budget
        self.total = 0.0
        self._probation: collections.OrderedDict[Hashable, float] = collections.OrderedDict()  # oldest first
        self._protected: collections.OrderedDict[Hashable, float] = collections.OrderedDict()
        self._protected_total = 0.0

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._protected or key in self._probation

    def keys_recent_first(self) -> Iterator[Hashable]:
        """Protected keys, then probation's, each most recently used first."""
        yield from reversed(self._protected)
        yield from reversed(self._probation)

    def discard(self, key: Hashable) -> None:
        if key in self._protected:
            weight = self._protected.pop(key)
            self._protected_total -= weight
            self.total -= weight
        elif key in self._probation:
            self.total -= self._probation.pop(key)

    def use(self, keys: Iterable[tuple[Hashable, float, bool]]) -> list[Hashable]:
        """Record uses of ``(key, weight, again)`` in order (the last is the most recent); ``again``: promote even a
        key not held (the caller knows it was used before, as an engine knows a block it matched). Returns the keys
        evicted to keep the budget."""
        for key, weight, again in keys:
            again = again or key in self
            self.discard(key)
            if again:
                self._protected[key] = weight
                self._protected_total += weight
            else:
                self._probation[key] = weight
            self.total += weight
        while self._protected and self._protected_total > self.protected_budget:
            key, weight = self._protected.popitem(last=False)
            self._protected_total -= weight
            self._probation[key] = weight
        evicted = []
        while self.total > self.budget and len(self):
            key = next(iter(self._probation or self._protected))
            self.discard(key)
            evicted.append(key)
        return evicted


class PrefixLedger:
    """Prefix blocks held, by chain hash, in a :class:`SegmentedLRU`; ``tokens`` of them at most ``budget_tokens``."""

    def __init__(self, budget_tokens: int, tenant_scoped: bool = True) -> None:
        self.budget_tokens = budget_tokens
        self.tenant_scoped = tenant_scoped
        self._blocks = SegmentedLRU(budget_tokens)

    @classmethod
    def from_settings(cls, worker: WorkerSettings) -> PrefixLedger | None:
        """The ledger ``worker``'s settings ask for (None: prefix caching is off)."""
        if not worker.prefix_cache:
            return None
        return cls(worker.prefix_cache_budget_tokens, worker.prefix_cache_scope == "tenant")

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def tokens(self) -> float:
        return self._blocks.total

    def chain(self, request: wire.GenerationRequest) -> tuple[int, ...]:
        """``request``'s prefix chain, salted as this cache is scoped."""
        return prefixes.request_chain(request, self.tenant_scoped)

    def match(self, chain: tuple[int, ...]) -> int:
        """Leading blocks of ``chain`` held (a lookup: recency changes only by :meth:`record`)."""
        return prefixes.matched_blocks(chain, self._blocks)

    def record(self, chain: tuple[int, ...], tokens_per_block: float) -> None:
        """A prompt with ``chain`` ran: its blocks become the most recently used (its first block last, so that a chain
        loses its tail before its head; a block held already counts as used again), then blocks go until the budget
        holds."""
        self._blocks.use((block, tokens_per_block, False) for block in reversed(chain))

    def summary(self, max_blocks: int) -> list[int]:
        """The held hashes, most recently used first (those used more than once before the rest), at most
        ``max_blocks``."""
        return list(itertools.islice(self._blocks.keys_recent_first(), max_blocks))


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

"""Which continuous-batching worker a batch goes to: the one whose prompt cache holds most of its first request's
prefix, unless that one is loaded past a threshold (llm-d's and SGLang's cache-aware routing).

:func:`choose` is the pure decision over plain data; :class:`PrefixRouter` gathers its inputs from the worker pool and
the :class:`~llmq_batcher.prefix_index.PrefixIndex`, and records each batch's prefixes under its worker. A worker's
load is ``1 - free / max_slots``, its free slots as its heartbeat said less what this batcher sent it since. Every
candidate has room, so the choice never sends a batch where the capacity ledger has none to give by this batcher's
view. Fixed-time workers are not routed here: their window logic (workers.py) keeps the least-loaded one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from llmq_batcher.entries import Entry
from llmq_batcher.prefix_index import PrefixIndex
from llmq_batcher.workers import WorkerView
from llmq_core.prefixes import request_chain

RouteReason = Literal["affinity", "load_override", "no_match", "off"]
REASONS: tuple[RouteReason, ...] = ("affinity", "load_override", "no_match", "off")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A worker with room: ``free_slots`` of ``max_slots`` free; ``matched_blocks`` of the request's chain held."""

    worker_id: str
    free_slots: int
    max_slots: int
    matched_blocks: int

    @property
    def load(self) -> float:
        return 1 - self.free_slots / self.max_slots if self.max_slots > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Route:
    """Where a batch goes and why: ``affinity`` (the holder of most of its prefix), ``load_override`` (the holder is
    loaded past the threshold: the least-loaded instead), ``no_match`` (no candidate holds a block: least-loaded),
    ``off`` (prefix routing disabled: least-loaded). ``matched_blocks``: what the chosen worker holds."""

    worker_id: str
    reason: RouteReason
    matched_blocks: int = 0


def choose(candidates: Sequence[Candidate], least_loaded: str, max_load: float) -> Route:
    """The route among ``candidates`` (non-empty, each with room; ``least_loaded``: the id of the one the pool ranks
    first, among them). The holder is the candidate matching most blocks (then the less loaded, then the lower id); it
    keeps affinity while its load is below ``max_load``, or when it is the least-loaded one anyway."""
    holder = min(candidates, key=lambda c: (-c.matched_blocks, c.load, c.worker_id))
    if holder.matched_blocks == 0:
        return Route(least_loaded, "no_match")
    if holder.load < max_load or holder.worker_id == least_loaded:
        return Route(holder.worker_id, "affinity", holder.matched_blocks)
    fallback = next(c for c in candidates if c.worker_id == least_loaded)
    return Route(least_loaded, "load_override", fallback.matched_blocks)


def entry_chain(entry: Entry, tenant_scoped: bool) -> tuple[int, ...]:
    """``entry``'s prefix chain in one scope, hashed once and kept on the entry."""
    chains = entry.chains
    if chains is None:
        chains = entry.chains = [None, None]
    chain = chains[tenant_scoped]
    if chain is None:
        chain = chains[tenant_scoped] = request_chain(entry.request, tenant_scoped)
    return chain


class PrefixRouter:
    """Routes a model's batches by ``index`` when ``enabled``; ``max_load``: the threshold of :func:`choose`."""

    __slots__ = ("index", "enabled", "max_load")

    def __init__(self, index: PrefixIndex, enabled: bool, max_load: float) -> None:
        self.index = index
        self.enabled = enabled
        self.max_load = max_load

    def route(
        self, workers: Iterable[WorkerView], best: WorkerView, head: Entry | None, now_ms: int
    ) -> tuple[WorkerView, RouteReason | None]:
        """The worker for a batch headed by ``head`` among a model's live ``workers`` (``best``: the pool's
        least-loaded one with room, continuous-batching) and why; None: not routed (no head to take)."""
        if head is None:
            return best, None
        if not self.enabled:
            return best, "off"
        index, views, candidates = self.index, {}, []
        for worker in workers:
            free = 0 if worker.fixed else worker.free_slots(now_ms)
            if free > 0:
                worker_id = worker.worker_id
                views[worker_id] = worker
                matched = index.matched(worker_id, entry_chain(head, index.tenant_scoped(worker_id)), now_ms)
                candidates.append(Candidate(worker_id, free, worker.max_slots, matched))
        if best.worker_id not in views:  # the pool's lazy ranking can name a worker whose room is gone: no routing
            return best, None
        route = choose(candidates, best.worker_id, self.max_load)
        return views[route.worker_id], route.reason

    def dispatched(self, worker: WorkerView, entries: Iterable[Entry], now_ms: int) -> None:
        """A batch of ``entries`` went to ``worker``: it holds their prefixes now (continuous-batching workers only)."""
        if not self.enabled or worker.fixed:
            return
        scoped = self.index.tenant_scoped(worker.worker_id)
        self.index.dispatched(worker.worker_id, worker.model, (entry_chain(e, scoped) for e in entries), now_ms)

"""What the batching policy has out in batches: each dispatched batch, its worker's count of it, and the per-tenant
in-flight cap.

A batch's entries stay in flight (counted against their worker's slots and their tenant's cap) until a result or an
idle heartbeat shows them finished, or at the latest until their last deadline plus the grace a worker has to answer.
A tenant at its cap is parked in the queues that found it so; releasing one of its entries wakes them.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

from llmq_batcher.entries import DISPATCHED, DONE, Entry, EntryTable, Flight
from llmq_batcher.fairshare import FairQueue
from llmq_batcher.fleet import Fleet, ModelState
from llmq_batcher.prefix_route import RouteReason
from llmq_batcher.workers import WorkerView
from llmq_core import constants, wire


@dataclass(slots=True)
class BatchDispatch:
    """A batch to produce to ``llmq.batches`` at ``partition``."""

    batch_id: str
    worker_id: str
    partition: int
    model: str
    requests: list[wire.GenerationRequest]
    flush_reason: wire.FlushReason
    formed_ms: int
    route: RouteReason | None = None  # why prefix routing chose its worker (None: not routed, see prefix_route.py)
    preempting: bool = False  # formed into its worker's preemptible room (forming.py): no free slots, no deferred work

    def urgent(self) -> bool:
        """Whether no request of the batch is deferred: the worker's ledger then also grants its preemptible room."""
        return all(r.traffic_class != constants.DEFERRED for r in self.requests)

    def to_wire(self) -> wire.Batch:
        return wire.Batch(
            batch_id=self.batch_id,
            worker_id=self.worker_id,
            model=self.model,
            requests=self.requests,
            formed_ms=self.formed_ms,
            flush_reason=self.flush_reason,
        )


class Flights:
    """Dispatches batches (ids ``<batch_id_prefix>-<n>``) and settles their entries. An entry is counted in flight for
    at most its deadline plus ``grace_ms``; a tenant may have ``tenant_max_inflight`` entries in flight."""

    def __init__(
        self, entries: EntryTable, fleet: Fleet, *, batch_id_prefix: str, grace_ms: int, tenant_max_inflight: int
    ) -> None:
        self._entries = entries
        self._fleet = fleet
        self._batch_id_prefix = batch_id_prefix
        self._grace_ms = grace_ms
        self._tenant_max_inflight = tenant_max_inflight
        self._releases: list[tuple[int, int, Flight]] = []  # dispatched batches by latest deadline + grace (lazy)
        self._parked: dict[str, list[FairQueue]] = {}
        self._batches = 0

    def is_capped(self, tenant: str) -> bool:
        """Whether ``tenant`` has its most entries in flight (a queue then parks it: see :meth:`park`)."""
        return self._entries.tenant_inflight(tenant) >= self._tenant_max_inflight

    def park(self, tenant: str, queue: FairQueue) -> None:
        """``queue`` skips capped ``tenant`` until one of its entries is released."""
        self._parked.setdefault(tenant, []).append(queue)

    def dispatch(
        self,
        model: ModelState,
        worker: WorkerView,
        flight: Flight,
        reason: wire.FlushReason,
        now_ms: int,
        route: RouteReason | None = None,
        *,
        preempting: bool = False,
    ) -> BatchDispatch:
        """``flight`` (its entries already DISPATCHED) as a new batch to ``worker``, counted against its slots;
        ``route``: why prefix routing chose ``worker``; ``preempting``: the batch goes into its preemptible room."""
        batch_id = self._next_batch_id()
        requests = [entry.request for entry in flight.entries]
        release_ms = max(r.deadline_ms for r in requests) + self._grace_ms
        heapq.heappush(self._releases, (release_ms, self._batches, flight))
        worker.record_dispatch(batch_id, flight.entries, now_ms)
        model.pool.touch(worker)
        if worker.fixed:
            model.busy_until_ms = max(model.busy_until_ms, worker.busy_until_ms)
        return BatchDispatch(
            batch_id, worker.worker_id, worker.partition, model.name, requests, reason, now_ms, route, preempting
        )

    def split(self, batch: BatchDispatch, now_ms: int) -> list[BatchDispatch]:
        """The requests of refused ``batch`` still in flight at its worker, as two batches to it (one if fewer than
        two; none without its worker)."""
        worker = self._fleet.workers.get(batch.worker_id)
        entries = self.take_back(batch)
        if worker is None or not entries:
            return []
        half = (len(entries) + 1) // 2
        parts = [entries[:half], entries[half:]] if len(entries) > 1 else [entries]
        return [self._redispatch(worker, batch, part, now_ms) for part in parts]

    def shrink(self, batch: BatchDispatch, keep: int) -> tuple[BatchDispatch, list[Entry]]:
        """``batch`` with only its first ``keep`` requests (same id and worker); returns it and the entries left out,
        no longer counted at the worker (still DISPATCHED: the caller re-queues them)."""
        entries = self.take_back(batch, forget=False)
        kept, dropped = entries[:keep], entries[keep:]
        worker = self._fleet.workers.get(batch.worker_id)
        if worker is not None:
            worker.shrink_batch(batch.batch_id, dropped)
            self._fleet.touch(worker)
        return dataclasses.replace(batch, requests=[e.request for e in kept]), dropped

    def take_back(self, batch: BatchDispatch, forget: bool = True) -> list[Entry]:
        """Undo the worker's count of a batch that never reached Kafka (``forget``); its entries still in flight there,
        in order."""
        worker = self._fleet.workers.get(batch.worker_id)
        if worker is not None and forget:
            worker.forget_batch(batch.batch_id)
            self._fleet.touch(worker)
        entries = [self._entries.get(r.request_id) for r in batch.requests]
        return [e for e in entries if e is not None and e.state is DISPATCHED and e.flight.worker_id == batch.worker_id]

    def release(self, entry: Entry) -> None:
        """An in-flight entry is finished (or handed back): free its worker's slot and its tenant's count."""
        if entry.state is not DISPATCHED:
            return
        self._entries.transition(entry, DONE)
        worker = self._fleet.workers.get(entry.flight.worker_id)
        if worker is not None:
            worker.release(entry.request.request_id)
        tenant = entry.tenant
        if tenant in self._parked and not self.is_capped(tenant):
            for queue in self._parked.pop(tenant):
                queue.activate(tenant)

    def release_overdue(self, now_ms: int) -> None:
        """Stop counting the entries of batches whose deadline and grace passed by ``now_ms``: a worker finishes or
        expires a request by its deadline, so one without a result seen by then is not running any more."""
        releases = self._releases
        while releases and releases[0][0] <= now_ms:
            for entry in heapq.heappop(releases)[2].entries or ():
                self.release(entry)
        if len(releases) > 2 * self._entries.live_flights + 4096:
            self._releases = [item for item in releases if item[2].live]
            heapq.heapify(self._releases)

    def _redispatch(self, worker: WorkerView, batch: BatchDispatch, entries: list[Entry], now_ms: int) -> BatchDispatch:
        """Part of a refused batch, to the same worker under a new id (its entries stay in flight there)."""
        batch_id = self._next_batch_id()
        worker.record_dispatch(batch_id, entries, now_ms)
        self._fleet.touch(worker)
        return BatchDispatch(
            batch_id,
            worker.worker_id,
            worker.partition,
            batch.model,
            [e.request for e in entries],
            batch.flush_reason,
            batch.formed_ms,
            preempting=batch.preempting,
        )

    def _next_batch_id(self) -> str:
        self._batches += 1
        return f"{self._batch_id_prefix}-{self._batches}"

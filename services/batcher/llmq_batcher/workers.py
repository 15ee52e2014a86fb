"""The batcher's view of workers: capacity from heartbeats corrected for batches sent since, and least-loaded choice.

A heartbeat's ``free_slots`` is stale the moment it is sent: batches dispatched after the worker's ``last_batch_id``
have not been counted yet, so they are subtracted here. Fixed-time engines (``fixed_batch_time_ms`` > 0) run one batch
at a time; the batcher predicts when each becomes free (``busy_until_ms``) and sends it the next batch only then, so a
batch can keep filling in the batcher instead of waiting in the worker.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from llmq_batcher.entries import Entry
from llmq_core import wire

ASSUMED_SERVICE_MS = 1000  # a continuous-batching slot's service time while the worker has no drain estimate


class WorkerView:
    """One live worker. ``since`` holds (batch_id, requests, dispatched_ms) sent after its newest heartbeat's batch."""

    __slots__ = (
        "worker_id",
        "partition",
        "model",
        "max_slots",
        "fixed_batch_ms",
        "hb_free",
        "est_drain_ms",
        "last_heard_ms",
        "since",
        "since_count",
        "busy_until_ms",
        "_inflight",
        "version",
    )

    def __init__(self, hb: wire.WorkerHeartbeat) -> None:
        self.worker_id = hb.worker_id
        self.partition = hb.partition
        self.model = hb.model
        self.since: deque[tuple[str, int, int]] = deque()
        self.since_count = 0
        self.busy_until_ms = 0
        self._inflight: dict[str, Entry] = {}
        self.version = 0
        self.last_heard_ms = 0
        self.max_slots = self.fixed_batch_ms = self.hb_free = self.est_drain_ms = 0

    @property
    def fixed(self) -> bool:
        return self.fixed_batch_ms > 0

    def apply_heartbeat(self, hb: wire.WorkerHeartbeat, now_ms: int, taken_after_ms: int) -> bool:
        """Take in a heartbeat received at ``now_ms``. Batches sent more than ``taken_after_ms`` ago are assumed taken
        even when ``last_batch_id`` does not name them (another batcher's batch, a restarted worker).
        Returns True when the worker is idle and has taken every batch we sent: all our in-flight work there is done."""
        self.max_slots = hb.max_slots
        self.fixed_batch_ms = hb.fixed_batch_time_ms
        self.hb_free = hb.free_slots
        self.est_drain_ms = hb.est_drain_ms
        self.last_heard_ms = now_ms
        self._forget_taken(hb.last_batch_id, now_ms - taken_after_ms)
        if self.fixed:
            drained_at = now_ms + max(hb.est_drain_ms, 0) if hb.running or hb.queued else now_ms
            self.busy_until_ms = drained_at if not self.since else max(self.busy_until_ms, drained_at)
        return not self.since and hb.running == 0 and hb.queued == 0

    def record_dispatch(self, batch_id: str, entries: list[Entry], now_ms: int) -> None:
        """Count a batch just sent to this worker against its free capacity; its entries are in flight here."""
        for entry in entries:
            self._inflight[entry.request.request_id] = entry
        self.since.append((batch_id, len(entries), now_ms))
        self.since_count += len(entries)
        if self.fixed:
            self.busy_until_ms = max(self.busy_until_ms, now_ms) + self.fixed_batch_ms

    def forget_batch(self, batch_id: str) -> None:
        """Undo :meth:`record_dispatch` for a batch that never reached Kafka."""
        for item in self.since:
            if item[0] == batch_id:
                self.since.remove(item)
                self.since_count -= item[1]
                return

    def release(self, request_id: str) -> None:
        """``request_id`` is no longer in flight here (finished or handed back)."""
        self._inflight.pop(request_id, None)

    def held(self) -> list[Entry]:
        """The entries in flight here, as a list the caller may release them from."""
        return list(self._inflight.values())

    def free_slots(self, now_ms: int) -> int:
        """Requests this worker can take now (before the model's batch cap)."""
        if self.fixed:
            return self.max_slots if self.busy_until_ms <= now_ms else 0
        return max(self.hb_free - self.since_count, 0)

    def capacity_per_s(self) -> float:
        """Requests per second this worker can take by its heartbeat: its slots per batch time (fixed-time engines) or
        per its drain estimate, at least ASSUMED_SERVICE_MS (continuous batching). API pods predict waits with it until
        a backlog's drain rate is measured."""
        return self.max_slots * 1000 / (self.fixed_batch_ms or max(self.est_drain_ms, ASSUMED_SERVICE_MS))

    def reserved_slots(self, share: float) -> int:
        """Slots deferred work must leave free for interactive work."""
        return math.ceil(self.max_slots * share)

    def heap_key(self) -> tuple | None:
        """Ordering for :class:`WorkerPool`: ready time, then most free slots, then least drain time; None: no room."""
        if self.fixed:
            return (self.busy_until_ms, -self.max_slots, self.est_drain_ms, self.worker_id, self.version)
        free = self.hb_free - self.since_count
        if free <= 0:
            return None
        return (0, -free, self.est_drain_ms, self.worker_id, self.version)

    def _forget_taken(self, last_batch_id: str, cutoff_ms: int) -> None:
        since = self.since
        if last_batch_id and any(item[0] == last_batch_id for item in since):
            while since:
                batch_id, size, _ = since.popleft()
                self.since_count -= size
                if batch_id == last_batch_id:
                    break
        while since and since[0][2] < cutoff_ms:
            self.since_count -= since.popleft()[1]


class WorkerPool:
    """Live workers of one model in a lazily invalidated heap: :meth:`best` is O(log workers) amortised."""

    __slots__ = ("workers", "heap")

    def __init__(self) -> None:
        self.workers: dict[str, WorkerView] = {}
        self.heap: list[tuple] = []

    def touch(self, worker: WorkerView) -> None:
        """Re-rank ``worker`` after its state changed (heartbeat, dispatch)."""
        worker.version += 1
        key = worker.heap_key()
        if key is not None:
            heapq.heappush(self.heap, key)
        if len(self.heap) > 4 * len(self.workers) + 64:
            self._rebuild()

    def add(self, worker: WorkerView) -> None:
        self.workers[worker.worker_id] = worker
        self.touch(worker)

    def remove(self, worker: WorkerView) -> None:
        self.workers.pop(worker.worker_id, None)
        worker.version += 1

    def best(self, now_ms: int) -> WorkerView | None:
        """The worker with room now and the least outstanding work (most free slots, then least drain time)."""
        item = self._top()
        if item is None or item[0] > now_ms:
            return None
        return self.workers[item[3]]

    def next_ready_ms(self) -> int | None:
        """When the next worker gets room by itself (a fixed-time engine finishing its batch), if known."""
        item = self._top()
        return item[0] if item is not None else None

    def _top(self) -> tuple | None:
        heap = self.heap
        while heap:
            item = heap[0]
            worker = self.workers.get(item[3])
            if worker is not None and worker.version == item[4]:
                return item
            heapq.heappop(heap)
        return None

    def _rebuild(self) -> None:
        keys = (w.heap_key() for w in self.workers.values())
        self.heap = [k for k in keys if k is not None]
        heapq.heapify(self.heap)

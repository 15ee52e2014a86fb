"""The batcher's view of workers: capacity from heartbeats corrected for batches sent since, and least-loaded choice.

A heartbeat's ``free_slots`` is stale the moment it is sent: batches dispatched after the worker's ``last_batch_id``
have not been counted yet, so they are subtracted here. Fixed-time engines (``fixed_batch_time_ms`` > 0) run up to
``max_slots`` requests at a time, taking the next window's from their queue when one ends; the batcher predicts when
the next window with room starts (``busy_until_ms``) and how much room it has (``window_room``). It sends a batch only
then, so that a batch keeps filling in the batcher instead of waiting in the worker; or, with class leads
(``steps``: :class:`LeadSteps`, one lead per CLASS_KEYS entry, highest class first), that long before, class by class, so that the batches
several batchers send for one window meet in the worker's queue, the highest class's first.

A continuous-batching worker that preempts reports ``preemptible``: running deferred sequences it would preempt for
interactive or near-interactive work. When no worker of a model has free room, such work may go into that room
(``preemptible_room``, corrected for batches sent since like ``free_slots``); deferred work never does.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from llmq_batcher.entries import Entry
from llmq_core import wire

_ALL = 1 << 30  # every class (no leads configured)
ASSUMED_SERVICE_MS = 1000  # a continuous-batching slot's service time while the worker has no drain estimate


@dataclass(frozen=True, slots=True)
class LeadSteps:
    """When batches go ahead of a fixed-time worker's next window: from ``leads_ms[i]`` before it, the first ``i + 1``
    CLASS_KEYS entries may send (highest first; leads decreasing, one step each)."""

    leads_ms: tuple[int, ...] = ()

    def begun(self, ahead_ms: int) -> int:
        """Steps begun ``ahead_ms`` before the window starts."""
        return sum(1 for lead in self.leads_ms if ahead_ms <= lead)

    def lead_after(self, begun: int) -> int | None:
        """The lead of the step after the first ``begun`` (None: none)."""
        return self.leads_ms[begun] if begun < len(self.leads_ms) else None


NO_STEPS = LeadSteps()


class WorkerView:
    """One live worker. ``since`` holds (batch_id, requests, dispatched_ms) sent after its newest heartbeat's batch."""

    __slots__ = (
        "worker_id",
        "partition",
        "model",
        "max_slots",
        "fixed_batch_ms",
        "hb_free",
        "hb_preemptible",
        "est_drain_ms",
        "last_heard_ms",
        "since",
        "since_count",
        "busy_until_ms",
        "window_room",
        "phase",
        "steps",
        "_inflight",
        "version",
    )

    def __init__(self, hb: wire.WorkerHeartbeat, steps: LeadSteps | None = None) -> None:
        self.worker_id = hb.worker_id
        self.partition = hb.partition
        self.model = hb.model
        self.since: deque[tuple[str, int, int]] = deque()
        self.since_count = 0
        self.busy_until_ms = 0
        self.window_room = hb.max_slots
        self.phase = 0  # steps begun when this batcher last sent for the window at busy_until_ms
        self.steps = steps or NO_STEPS
        self._inflight: dict[str, Entry] = {}
        self.version = 0
        self.last_heard_ms = 0
        self.max_slots = self.fixed_batch_ms = self.hb_free = self.hb_preemptible = self.est_drain_ms = 0

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
        self.hb_preemptible = hb.preemptible
        self.est_drain_ms = hb.est_drain_ms
        self.last_heard_ms = now_ms
        self._forget_taken(hb.last_batch_id, now_ms - taken_after_ms)
        if self.fixed:
            start_ms, room = self._next_window(hb, now_ms)
            if not self.since or start_ms > self.busy_until_ms:
                self._open_window(start_ms, room)
        return not self.since and hb.running == 0 and hb.queued == 0

    def _next_window(self, hb: wire.WorkerHeartbeat, now_ms: int) -> tuple[int, int]:
        """When the heartbeat's worker starts its first window with room, and that room: its queue fills windows of
        ``max_slots`` in order (``est_drain_ms`` is the running window's rest plus one batch time per started window
        of queued requests). Without leads, a window after all its work."""
        if not (hb.running or hb.queued):
            return now_ms, hb.max_slots
        if not self.steps.leads_ms:  # nothing is sent ahead: the next batch waits for all of the worker's work to drain
            return now_ms + max(hb.est_drain_ms, 0), hb.max_slots
        size = max(hb.max_slots, 1)
        rest_ms = max(hb.est_drain_ms - -(-hb.queued // size) * self.fixed_batch_ms, 0)
        return now_ms + rest_ms + hb.queued // size * self.fixed_batch_ms, size - hb.queued % size

    def _open_window(self, start_ms: int, room: int) -> None:
        if start_ms != self.busy_until_ms:
            self.phase = 0
        self.busy_until_ms, self.window_room = start_ms, room

    def roll(self, now_ms: int) -> bool:
        """The window this batcher sent ahead for has started: the next one is the one with room. True if it moved."""
        if self.fixed and self.phase and now_ms >= self.busy_until_ms:
            self._open_window(self.busy_until_ms + self.fixed_batch_ms, self.max_slots)
            return True
        return False

    def begun(self, now_ms: int) -> int:
        """How many of the steps before the window at ``busy_until_ms`` have begun by ``now_ms``."""
        return self.steps.begun(self.busy_until_ms - now_ms)

    def open_classes(self, now_ms: int) -> int:
        """How many CLASS_KEYS entries, highest first, may send to this worker now: all once its next window is due,
        else those of the step begun last (none without leads)."""
        if not self.fixed or now_ms >= self.busy_until_ms:
            return _ALL
        return self.begun(now_ms)

    def next_phase_ms(self) -> int | None:
        """When the next step begins for the window at ``busy_until_ms`` after those begun by ``phase`` (None: none
        left before it starts)."""
        lead = self.steps.lead_after(self.phase)
        return None if lead is None else self.busy_until_ms - lead

    def record_dispatch(self, batch_id: str, entries: list[Entry], now_ms: int) -> None:
        """Count a batch just sent to this worker against its free capacity; its entries are in flight here."""
        for entry in entries:
            self._inflight[entry.request.request_id] = entry
        self.since.append((batch_id, len(entries), now_ms))
        self.since_count += len(entries)
        if not self.fixed:
            return
        if now_ms >= self.busy_until_ms:  # it finds the worker idle or its window due: it starts the next one at once
            self._open_window(now_ms + self.fixed_batch_ms, self.max_slots)
            return
        self.phase = self.begun(now_ms)  # sent ahead: it waits in the worker's queue for the window
        self.window_room -= len(entries)
        if self.window_room <= 0:
            self._open_window(self.busy_until_ms + self.fixed_batch_ms, self.max_slots)

    def follow(self, next_ms: int, next_room: int) -> None:
        """The fleet's ledger answered a claim for this worker: a fixed-time worker's next window a batch may be
        claimed for starts at ``next_ms`` with ``next_room`` (what other batchers' claims left)."""
        if self.fixed and next_ms:
            self._open_window(next_ms, next_room)

    def forget_batch(self, batch_id: str) -> None:
        """Undo :meth:`record_dispatch` for a batch that never reached Kafka."""
        for item in self.since:
            if item[0] == batch_id:
                self.since.remove(item)
                self.since_count -= item[1]
                return

    def shrink_batch(self, batch_id: str, dropped: list[Entry]) -> None:
        """Batch ``batch_id`` goes out without ``dropped`` (the fleet's ledger granted fewer): they are neither counted
        nor in flight here."""
        for i, (item_id, size, sent_ms) in enumerate(self.since):
            if item_id == batch_id:
                self.since[i] = (item_id, size - len(dropped), sent_ms)
                self.since_count -= len(dropped)
                break
        for entry in dropped:
            self._inflight.pop(entry.request.request_id, None)

    def release(self, request_id: str) -> None:
        """``request_id`` is no longer in flight here (finished or handed back)."""
        self._inflight.pop(request_id, None)

    def held(self) -> list[Entry]:
        """The entries in flight here, as a list the caller may release them from."""
        return list(self._inflight.values())

    def free_slots(self, now_ms: int) -> int:
        """Requests this worker can take now (before the model's batch cap)."""
        if self.fixed:
            return self.window_room if self.open_classes(now_ms) else 0
        return max(self.hb_free - self.since_count, 0)

    def preemptible_room(self) -> int:
        """Requests a continuous-batching worker can take now for interactive or near-interactive work beyond its free
        slots, by preempting running deferred sequences (0 for a fixed-time worker): what its free and preemptible
        slots leave after the batches sent since its heartbeat, less its free slots."""
        if self.fixed:
            return 0
        return max(min(self.hb_free + self.hb_preemptible - self.since_count, self.hb_preemptible), 0)

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
            lead_ms = self.steps.leads_ms[0] if self.steps.leads_ms else 0
            return (self.busy_until_ms - lead_ms, -self.max_slots, self.est_drain_ms, self.worker_id, self.version)
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
    """Live workers of one model in a lazily invalidated heap: :meth:`best` is O(log workers) amortised. Versions
    count pool-wide, so an entry left by a worker's earlier view (removed, then back with a fresh one) never passes
    for its new view's."""

    __slots__ = ("workers", "heap", "_versions")

    def __init__(self) -> None:
        self.workers: dict[str, WorkerView] = {}
        self.heap: list[tuple] = []
        self._versions = 0

    def touch(self, worker: WorkerView) -> None:
        """Re-rank ``worker`` after its state changed (heartbeat, dispatch)."""
        self._versions += 1
        worker.version = self._versions
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
        self._versions += 1
        worker.version = self._versions

    def best(self, now_ms: int) -> WorkerView | None:
        """The worker with room now and the least outstanding work (most free slots, then least drain time)."""
        item = self._top()
        if item is None or item[0] > now_ms:
            return None
        return self.workers[item[3]]

    def most_preemptible(self) -> WorkerView | None:
        """The continuous-batching worker with the most :meth:`WorkerView.preemptible_room` (None: none has any);
        ties go to the least drain time, then the worker id. A linear scan: it is asked only when no worker has
        free room."""
        best, best_key = None, None
        for worker in self.workers.values():
            room = worker.preemptible_room()
            if room <= 0:
                continue
            key = (-room, worker.est_drain_ms, worker.worker_id)
            if best_key is None or key < best_key:
                best, best_key = worker, key
        return best

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

"""Forming one model's batches: when a batch flushes, how many slots it gets, and which queued entries it takes.

A batch goes to the model's live worker with the least outstanding work (among continuous-batching workers, the one
holding most of its first request's prefix unless it is loaded past a threshold: prefix_route.py) and flushes on size
(the worker's free slots, capped by the model's max batch, or the byte budget of one record) or when its oldest request
has waited its class's window (``bound * room / (room + pending)``: it shrinks as work piles up). Deferred work only
fills slots above the worker's reserve, and only while no other class waits. When no worker has room and interactive or
near-interactive work waits, its batch goes to the continuous-batching worker with the most preemptible room (running
deferred sequences it would preempt for such work, workers.py), as many as that room, never deferred work. A batch takes
entries in class precedence, fair across tenants, and closes at the first one that would overflow its bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmq_batcher.classes import CLASS_KEYS, DEFERRED, TRAFFIC_CLASS
from llmq_batcher.entries import DISPATCHED, Entry, EntryTable, Flight
from llmq_batcher.fleet import ModelState
from llmq_batcher.flights import BatchDispatch, Flights
from llmq_batcher.prefix_index import PrefixIndex
from llmq_batcher.prefix_route import PrefixRouter, RouteReason
from llmq_batcher.workers import WorkerView
from llmq_core import wire

if TYPE_CHECKING:
    from llmq_batcher.policy import PolicyConfig


class BatchFormer:
    """Turns a model's queues into batches by ``config`` (windows, caps, byte budget, deferred reserve, prefix routing
    by ``prefixes``)."""

    def __init__(self, config: PolicyConfig, entries: EntryTable, flights: Flights, prefixes: PrefixIndex) -> None:
        self._config = config
        self._router = PrefixRouter(prefixes, config.prefix_routing, config.prefix_affinity_max_load)
        self._max_wait_ms = [config.max_wait_ms[TRAFFIC_CLASS[key]] for key in CLASS_KEYS]
        self._entries = entries
        self._flights = flights

    def form(self, model: ModelState, now_ms: int, drain: bool, out: list[BatchDispatch]) -> int | None:
        """Dispatch batches of ``model`` to ``out`` while a worker has room and a batch is due (``drain``: every batch
        is due); returns when to look again (None: on the next event)."""
        while model.depth():
            worker = model.pool.best(now_ms)
            if worker is None:
                worker = model.pool.most_preemptible() if self._urgent_queued(model) else None
                if worker is None:
                    return model.pool.next_ready_ms()
                room = self._preempting_room(model, worker)
                reason, due_ms = self._due(model, room, 0, now_ms, False, drain)
                if reason is None:
                    return _earliest(due_ms, model.pool.next_ready_ms())
                rooms = (room, 0, worker.open_classes(now_ms))
                if not self._send(model, worker, rooms, reason, now_ms, out, preempting=True):
                    return None
                continue
            if worker.roll(now_ms):
                model.pool.touch(worker)
                continue
            route = None
            if not worker.fixed:  # fixed-time workers: the least-loaded, as their windows were predicted for
                worker, route = self._router.route(model.pool.workers.values(), worker, self._head(model), now_ms)
            room, deferred_room = self._rooms(model, worker, now_ms)
            opened = worker.open_classes(now_ms)
            if worker.fixed and now_ms < worker.busy_until_ms:
                reason, due_ms = self._ahead(model, worker, opened, drain)
            else:
                reason, due_ms = self._due(model, room, deferred_room, now_ms, worker.fixed, drain)
            if reason is None:
                return due_ms
            if not self._send(model, worker, (room, deferred_room, opened), reason, now_ms, out, route):
                return None
        return None

    def _send(
        self,
        model: ModelState,
        worker: WorkerView,
        rooms: tuple[int, int, int],
        reason: wire.FlushReason,
        now_ms: int,
        out: list[BatchDispatch],
        route: RouteReason | None = None,
        preempting: bool = False,
    ) -> bool:
        """Take a batch for ``worker`` (``rooms``: room, deferred room, classes opened) and dispatch it to ``out``
        (``preempting``: into its preemptible room). False: nothing could be taken (every queued tenant is at its
        in-flight cap: results will wake us)."""
        room, deferred_room, opened = rooms
        flight, full = self._take(model, worker, room, deferred_room, opened)
        if not flight.live:
            return False
        if reason != "drain" and full:
            reason = "size"
        self._router.dispatched(worker, flight.entries, now_ms)
        out.append(self._flights.dispatch(model, worker, flight, reason, now_ms, route, preempting=preempting))
        return True

    def _head(self, model: ModelState) -> Entry | None:
        """The entry a batch of ``model`` would take first (as :meth:`_take` does with every class open)."""
        is_capped, park = self._flights.is_capped, self._flights.park
        for queue in model.queues:
            if queue.depth and (entry := queue.peek(is_capped, park)) is not None:
                return entry
        return None

    @staticmethod
    def _urgent_queued(model: ModelState) -> bool:
        """Whether interactive or near-interactive work of ``model`` is queued."""
        return any(q.depth for q in model.queues[:DEFERRED])

    def _preempting_room(self, model: ModelState, worker: WorkerView) -> int:
        """Slots for a batch into ``worker``'s preemptible room (capped by the model's max batch); deferred work may
        use none of them."""
        room = worker.preemptible_room()
        return min(room, self._config.model_max_batch.get(model.name, worker.max_slots) or room)

    def _rooms(self, model: ModelState, worker: WorkerView, now_ms: int) -> tuple[int, int]:
        """Slots for this batch, and how many of them deferred work may use (never the reserved last ones)."""
        free = worker.free_slots(now_ms)
        room = min(free, self._config.model_max_batch.get(model.name, worker.max_slots) or free)
        deferred = min(room, free - worker.reserved_slots(self._config.deferred_reserved_share))
        return room, max(deferred, 0)

    def _due(
        self, model: ModelState, room: int, deferred_room: int, now_ms: int, fixed: bool, drain: bool
    ) -> tuple[wire.FlushReason | None, int | None]:
        """Whether a batch flushes now and why; else (None, when its oldest request's window ends)."""
        queues = model.queues
        pending = sum(q.depth for q in queues[:DEFERRED])
        classes = [i for i in range(DEFERRED) if queues[i].depth]
        if not pending and deferred_room:
            pending, classes, room = min(queues[DEFERRED].depth, deferred_room), [DEFERRED], deferred_room
        if not classes:
            return None, None
        if drain:
            return "drain", None
        if pending >= room or sum(queues[i].size_bytes for i in classes) > self._config.max_batch_bytes:
            return "size", None
        due_ms = min(queues[i].oldest_enqueued_ms() + self._wait_ms(i, fixed, room, pending) for i in classes)
        if fixed and model.busy_until_ms > now_ms:
            due_ms = max(due_ms, self._busy_hold_ms(model, classes, room, pending))
        return ("wait", None) if due_ms <= now_ms else (None, due_ms)

    def _ahead(
        self, model: ModelState, worker: WorkerView, opened: int, drain: bool
    ) -> tuple[wire.FlushReason | None, int | None]:
        """A batch sent ahead of a fixed-time worker's next window goes once per class lead, with what the open classes
        hold then (``wait``), so that it meets in the worker's queue the batches other batchers send for that window;
        else (None, when the next class opens)."""
        has_work = any(q.depth for q in model.queues[:opened])
        if drain and has_work:
            return "drain", None
        if opened > worker.phase and has_work:
            return "wait", None
        later = worker.next_phase_ms()
        return None, later if later is not None else worker.busy_until_ms

    def _busy_hold_ms(self, model: ModelState, classes: list[int], room: int, pending: int) -> int:
        """Until when a batch that is not full waits while another batch of its fixed-time model runs: until that one
        ends, at most ``fixed_engine_busy_wait_ms`` after its oldest request came (shrinking as work piles up, as the
        window does). Under load the model then gets fewer, fuller batches (every later hop pays per batch, not per
        request); a request that finds no batch of its model running (light load) goes at once."""
        oldest_ms = min(model.queues[i].oldest_enqueued_ms() for i in classes)
        bound = self._config.fixed_engine_busy_wait_ms * room // (room + pending)
        return min(model.busy_until_ms, oldest_ms + bound)

    def _wait_ms(self, cls: int, fixed: bool, room: int, pending: int) -> int:
        bound = self._max_wait_ms[cls]
        if fixed:
            bound = max(bound, self._config.fixed_engine_max_wait_ms)
        return bound * room // (room + pending)

    def _take(
        self, model: ModelState, worker: WorkerView, room: int, deferred_room: int, opened: int
    ) -> tuple[Flight, bool]:
        """Dispatch to ``worker`` up to ``room`` entries of the first ``opened`` classes in class precedence, fair across
        tenants, deferred only after all others, until the next one would overflow the byte budget. Returns their flight
        and whether the batch is full (count or bytes)."""
        flight = Flight(worker.worker_id)
        budget_bytes = self._config.max_batch_bytes
        is_capped, park = self._flights.is_capped, self._flights.park
        for cls, queue in enumerate(model.queues[:opened]):
            limit = room if cls != DEFERRED else min(room, deferred_room)
            if cls == DEFERRED and any(q.depth for q in model.queues[:DEFERRED]):
                break
            while flight.live < limit and queue.depth:
                entry = queue.peek(is_capped, park)
                if entry is None:
                    break
                if entry.size_bytes > budget_bytes:
                    return flight, True  # it heads the next batch: nothing behind it may pass it
                queue.take(entry)
                budget_bytes -= entry.size_bytes
                self._entries.transition(entry, DISPATCHED, flight)  # counts the tenant's in-flight cap at once
        return flight, flight.live >= room


def _earliest(*times_ms: int | None) -> int | None:
    """The earliest of ``times_ms`` that is known (None: none is)."""
    known = [t for t in times_ms if t is not None]
    return min(known) if known else None

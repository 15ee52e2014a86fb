"""The batching policy: a pure class (no I/O, no asyncio) driven by events and ``schedule(now_ms)``.

Events in: :meth:`BatchPolicy.add`, :meth:`~BatchPolicy.cancel`, :meth:`~BatchPolicy.on_heartbeat`,
:meth:`~BatchPolicy.on_result`, :meth:`~BatchPolicy.undispatch`. Decisions out: :meth:`~BatchPolicy.schedule` returns the
batches to send, the requests to answer (expired, canceled, overloaded) and when to call it again. Time enters only as
the ``now_ms`` each event and decision is given (the policy reads no clock); every request it holds is an entry of its
:class:`~llmq_batcher.entries.EntryTable`, the one place entry states and their counts change.

Rules (docs/architecture.md): classes ``interactive:paid`` > ``interactive:free`` > ``near_interactive`` >
``deferred`` in strict precedence; deferred only fills capacity above a reserved share of a worker's slots: the slots a
batch of other work leaves empty (a fixed-time engine's batch costs the same whatever its size) or, while no other class
waits, a batch of its own; within a class tenants share by weighted fair queueing on estimated tokens (see fairshare.py) with
a per-tenant in-flight cap; one model per batch; each batch goes to the live worker of its model with the least
outstanding work; a batch flushes on size (the worker's free slots, capped by the model's max batch, or its byte budget:
one Batch is one Kafka record) or when its oldest request has waited the class's window (adaptive:
``bound * room / (room + pending)``, so it shrinks as work piles up). A batch takes requests in fair order and closes at
the first one that would overflow its bytes, which then heads the next batch; a request too large for any batch is
answered ``request_too_large`` on arrival.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from llmq_batcher.entries import DISPATCHED, DONE, QUEUED, Entry, EntryTable, Flight
from llmq_batcher.fairshare import FairQueue
from llmq_batcher.workers import WorkerPool, WorkerView
from llmq_core import constants, wire
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType

CLASS_KEYS = constants.PRIORITY_CLASSES  # queue index = position here: interactive:paid first, deferred last
DEFERRED = CLASS_KEYS.index(constants.DEFERRED)
# What a request's encoding may grow by after it is measured: a traceparent written at flush (57 bytes), a larger attempt.
ENTRY_SLACK_BYTES = 64
_PRIORITY = {
    (c, tier): constants.priority_class(c, tier) for c in constants.TRAFFIC_CLASSES for tier in constants.TIERS
}
_CLASS_INDEX = {pair: CLASS_KEYS.index(key) for pair, key in _PRIORITY.items()}  # (traffic class, tier) -> index
_TRAFFIC_CLASS = {key: c for (c, _), key in _PRIORITY.items()}  # CLASS_KEYS entry -> traffic class (its wait bound)


def class_index(request: wire.GenerationRequest) -> int:
    """Index into CLASS_KEYS of a request (tier matters only for interactive traffic)."""
    return _CLASS_INDEX[(request.traffic_class, request.tier)]


def estimated_tokens(request: wire.GenerationRequest) -> int:
    """Work estimate for fair sharing: prompt tokens (or characters when the producer did not count) + max_tokens * n."""
    prompt = request.prompt_tokens
    if prompt <= 0:
        if request.prompt is not None:
            prompt = len(request.prompt)
        elif request.messages:
            prompt = sum(len(m.content) for m in request.messages)
    sampling = request.sampling
    return max(prompt + sampling.max_tokens * sampling.n, 1)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Tunables, from service settings (:meth:`from_settings`, :meth:`defaults`). ``max_wait_ms`` is the wait bound per
    traffic class (both interactive tiers share one); times in ms; batch ids are ``<batch_id_prefix>-<n>``."""

    max_wait_ms: Mapping[str, int]
    fixed_engine_max_wait_ms: int
    worker_heartbeat_timeout_ms: int
    max_queued: int
    deferred_reserved_share: float
    deferred_buffer_rounds: int
    tenant_max_inflight: int
    tenant_weights: Mapping[str, float]
    batch_id_prefix: str
    model_max_batch: Mapping[str, int] = field(
        default_factory=lambda: {m.name: m.max_batch_size for m in BUILTIN_MODELS.values()}
    )
    recent_cancels_max: int = 100_000
    max_batch_bytes: int = constants.KAFKA_MAX_MESSAGE_BYTES - constants.RECORD_HEADROOM_BYTES  # encoded requests
    fixed_engine_busy_wait_ms: int = 0  # see BatchPolicy._busy_hold_ms

    @classmethod
    def from_settings(cls, settings: Settings, batch_id_prefix: str) -> PolicyConfig:
        """The policy's configuration from service settings; batch ids are ``<batch_id_prefix>-<n>``."""
        batcher = settings.batcher
        return cls(
            max_wait_ms=batcher.max_wait_ms(),
            fixed_engine_max_wait_ms=batcher.fixed_engine_max_wait_ms,
            fixed_engine_busy_wait_ms=batcher.fixed_engine_busy_wait_ms,
            worker_heartbeat_timeout_ms=batcher.worker_heartbeat_timeout_ms,
            max_queued=batcher.max_queued,
            deferred_reserved_share=batcher.deferred_reserved_share,
            deferred_buffer_rounds=batcher.deferred_buffer_rounds,
            tenant_max_inflight=batcher.tenant_max_inflight,
            tenant_weights=dict(batcher.tenant_weights),
            batch_id_prefix=batch_id_prefix,
        )

    @classmethod
    def defaults(cls, batch_id_prefix: str, **overrides) -> PolicyConfig:
        """The configuration of the settings' defaults (the environment unread), then ``overrides`` (fields)."""
        return dataclasses.replace(cls.from_settings(Settings.defaults(), batch_id_prefix), **overrides)


class AddStatus(enum.Enum):
    QUEUED = "queued"
    DUPLICATE = "duplicate"  # the request id is already queued or in flight here
    ANSWERED = "answered"  # rejected, expired or canceled on arrival: its Answer comes with the next decision


_QUEUED_STATUS = AddStatus.QUEUED  # enum member lookups cost ~0.5 us on 3.11: add() is the hot path


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

    def to_wire(self) -> wire.Batch:
        return wire.Batch(
            batch_id=self.batch_id,
            worker_id=self.worker_id,
            model=self.model,
            requests=self.requests,
            formed_ms=self.formed_ms,
            flush_reason=self.flush_reason,
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """A request the batcher itself answers: ``outcome`` is expired, canceled or errored (``error_type`` overloaded,
    invalid_request_error with ``code`` request_too_large, server_error)."""

    request: wire.GenerationRequest
    outcome: wire.Outcome
    error_type: str
    message: str
    retryable: bool = False
    code: str | None = None


@dataclass(slots=True)
class Decision:
    """What to do now. ``dropped``: request ids settled without an answer (a result for them was already seen).
    ``next_wake_ms``: call schedule again then at the latest (None: only on the next event)."""

    batches: list[BatchDispatch]
    answers: list[Answer]
    dropped: list[str]
    next_wake_ms: int | None
    load: dict[str, wire.QueueLoad]  # depth and oldest age per CLASS_KEYS entry, all models together


class _Model:
    __slots__ = ("name", "queues", "pool", "worker_seen_ms", "hold_until_ms", "busy_until_ms")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queues = [FairQueue() for _ in CLASS_KEYS]
        self.pool = WorkerPool()
        self.worker_seen_ms = 0
        self.hold_until_ms = 0  # no batches before then: producing them failed for a transient reason
        self.busy_until_ms = 0  # when the last batch sent to one of its fixed-time workers ends, as predicted

    def depth(self) -> int:
        return sum(q.depth for q in self.queues)


class BatchPolicy:
    """The batcher's decisions. Not thread-safe. Events cost O(log n) per request touched; schedule() adds O(models)."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._max_wait_ms = [config.max_wait_ms[_TRAFFIC_CLASS[key]] for key in CLASS_KEYS]
        self._models: dict[str, _Model] = {}
        self._workers: dict[str, WorkerView] = {}
        self._entries = EntryTable()
        self._deadlines: list[tuple[int, int, Entry]] = []  # queued entries by deadline (lazy)
        self._releases: list[tuple[int, int, Flight]] = []  # dispatched batches by latest deadline + grace (lazy)
        self._liveness: list[tuple[int, str]] = []  # (expires_ms, worker_id), lazy
        self._parked: dict[str, list[FairQueue]] = {}
        self._recent_cancels: OrderedDict[str, str] = OrderedDict()
        self._answers: list[Answer] = []
        self._dropped: list[str] = []
        self._seq = 0
        self._batches = 0

    @property
    def queued_total(self) -> int:
        """Requests queued here, all models and classes."""
        return self._entries.queued

    @property
    def inflight_total(self) -> int:
        """Requests dispatched here and not known finished."""
        return self._entries.inflight

    # --- events: each takes the time it happens at (``now_ms``, epoch ms), as schedule() does ----------------------

    def add(self, request: wire.GenerationRequest, now_ms: int) -> AddStatus:
        """Queue a request arriving at ``now_ms``. Duplicates of a request held here are ignored; expired,
        cancelled-before-arrival and over-the-bound requests are answered in the next decision."""
        request_id = request.request_id
        if request_id in self._entries:
            return AddStatus.DUPLICATE
        reason = self._recent_cancels.pop(request_id, None) if self._recent_cancels else None
        if reason is not None:
            return self._answer(request, wire.Outcome.CANCELED, ErrorType.BATCHER_CANCELED, reason)
        if request.deadline_ms <= now_ms:
            return self._answer(
                request, wire.Outcome.EXPIRED, ErrorType.BATCHER_EXPIRED, "deadline passed before dispatch"
            )
        size_bytes = len(wire.encode(request)) + ENTRY_SLACK_BYTES
        if size_bytes > self.config.max_batch_bytes:
            return self._answer(
                request,
                wire.Outcome.ERRORED,
                ErrorType.INVALID_REQUEST,
                f"The request is {size_bytes} bytes encoded; a batch record holds at most "
                f"{self.config.max_batch_bytes}. Shorten the prompt or stop sequences.",
                code=ErrorCode.REQUEST_TOO_LARGE,
            )
        if self._entries.queued >= self.config.max_queued:
            return self._answer(
                request, wire.Outcome.ERRORED, ErrorType.OVERLOADED, "batcher queue is full", retryable=True
            )
        self._seq += 1
        self._enqueue(Entry(request, self._seq, class_index(request), estimated_tokens(request), size_bytes, now_ms))
        return _QUEUED_STATUS

    def cancel(self, request_id: str, reason: str = "canceled") -> bool:
        """Cancel a queued request (answered as canceled). Unknown ids are remembered, so a request that arrives after
        its cancel is answered at once. Returns True when a queued request was cancelled here."""
        entry = self._entries.get(request_id)
        if entry is None:
            self._remember_cancel(request_id, reason)
            return False
        if entry.state is not QUEUED:
            return False  # already dispatched: the worker obeys the same Cancel
        self._settle_queued(entry)
        self._answer(entry.request, wire.Outcome.CANCELED, ErrorType.BATCHER_CANCELED, reason)
        return True

    def on_heartbeat(self, hb: wire.WorkerHeartbeat, now_ms: int) -> None:
        """Learn a worker's capacity from a heartbeat received at ``now_ms``; a new worker joins its model's pool, one
        that changed model or partition rejoins."""
        worker = self._workers.get(hb.worker_id)
        if worker is not None and (worker.model != hb.model or worker.partition != hb.partition):
            self._remove_worker(worker)
            worker = None
        if worker is None:
            worker = self._workers[hb.worker_id] = WorkerView(hb)
            self._model(hb.model).pool.add(worker)
        if worker.apply_heartbeat(hb, now_ms, self.config.worker_heartbeat_timeout_ms):
            for entry in worker.held():
                self._release(entry)
        model = self._model(hb.model)
        model.pool.touch(worker)
        model.worker_seen_ms = now_ms
        heapq.heappush(self._liveness, (now_ms + self.config.worker_heartbeat_timeout_ms + 1, hb.worker_id))

    def on_result(self, request_id: str, tenant_id: str | None = None) -> None:
        """A final result for ``request_id`` exists (from llmq.results): free its in-flight slot; a queued copy of it
        (re-queued or redelivered) is dropped and reported in ``Decision.dropped``. ``tenant_id`` given (the result's):
        one of another tenant than the request's is no result of it (a principal that may write llmq.results, a
        worker's, must not drop another tenant's queued request with a forged record)."""
        entry = self._entries.get(request_id)
        if entry is None or (tenant_id is not None and tenant_id != entry.tenant):
            return
        if entry.state is DISPATCHED:
            self._release(entry)
        else:
            self._settle_queued(entry)
            self._dropped.append(request_id)

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued or in flight here."""
        return request_id in self._entries

    def in_flight(self, request_id: str) -> bool:
        """Whether ``request_id`` went out in a batch here and no result of it was seen yet."""
        entry = self._entries.get(request_id)
        return entry is not None and entry.state is DISPATCHED

    def undispatch(self, batch: BatchDispatch, now_ms: int, retry_in_ms: int = 0) -> None:
        """Producing ``batch`` failed for a transient reason: take it back from its worker's count, re-queue its requests
        in front and form no batch of its model for ``retry_in_ms`` after ``now_ms``."""
        self._requeue(self._take_back(batch))
        model = self._model(batch.model)
        model.hold_until_ms = max(model.hold_until_ms, now_ms + retry_in_ms)

    def split(self, batch: BatchDispatch, now_ms: int) -> list[BatchDispatch]:
        """The record of ``batch`` was refused as too large: the same worker gets its requests as two batches (new ids,
        in order). Requests no longer in flight there are left out; fewer than two come back as one batch."""
        worker = self._workers.get(batch.worker_id)
        entries = self._take_back(batch)
        if worker is None or not entries:
            return []
        half = (len(entries) + 1) // 2
        parts = [entries[:half], entries[half:]] if len(entries) > 1 else [entries]
        return [self._redispatch(worker, batch, part, now_ms) for part in parts]

    def fail(self, batch: BatchDispatch, error_type: str, message: str, code: str) -> None:
        """The record of ``batch`` can never be produced: answer its requests errored (not retryable) in the next
        decision."""
        for entry in self._take_back(batch):
            self._release(entry)
            self._answer(entry.request, wire.Outcome.ERRORED, error_type, message, code=code)

    # --- decisions ----------------------------------------------------------------------------------------------------

    def schedule(self, now_ms: int, drain: bool = False) -> Decision:
        """Decide at ``now_ms``: expire, form and route batches. ``drain`` flushes every batch that has a worker,
        ignoring wait windows (shutdown)."""
        self._expire_workers(now_ms)
        self._expire_deadlines(now_ms)
        self._release_overdue(now_ms)
        batches: list[BatchDispatch] = []
        wakes = [self._next_housekeeping_ms()]
        for model in self._models.values():
            if model.hold_until_ms > now_ms and not drain:
                wakes.append(model.hold_until_ms)
            elif model.depth():
                wakes.append(self._schedule_model(model, now_ms, drain, batches))
        answers, self._answers = self._answers, []
        dropped, self._dropped = self._dropped, []
        future = [t for t in wakes if t is not None and t > now_ms]
        return Decision(batches, answers, dropped, min(future) if future else None, self.load(now_ms))

    def load(self, now_ms: int) -> dict[str, wire.QueueLoad]:
        """Queue depth and oldest queued age (ms) per class, over all models."""
        out = {}
        for index, key in enumerate(CLASS_KEYS):
            depth, oldest = 0, now_ms
            for model in self._models.values():
                queue = model.queues[index]
                if queue.depth:
                    depth += queue.depth
                    oldest = min(oldest, queue.oldest_enqueued_ms() or now_ms)
            out[key] = wire.QueueLoad(depth=depth, oldest_age_ms=now_ms - oldest)
        return out

    def model_states(self, now_ms: int) -> dict[str, wire.ModelLoad]:
        """Every model seen (in a request or a heartbeat) -> its queues, live workers, their slots and capacity, and
        last worker heartbeat (drain rates are the loop's to fill in)."""
        return {
            model.name: wire.ModelLoad(
                classes={
                    key: wire.QueueLoad(
                        depth=q.depth, oldest_age_ms=now_ms - (q.oldest_enqueued_ms() or now_ms) if q.depth else 0
                    )
                    for key, q in zip(CLASS_KEYS, model.queues)
                },
                workers=len(model.pool.workers),
                slots=sum(w.max_slots for w in model.pool.workers.values()),
                worker_seen_ms=model.worker_seen_ms,
                capacity_per_s=sum(w.capacity_per_s() for w in model.pool.workers.values()),
            )
            for model in self._models.values()
        }

    def requests_by_pod(self) -> dict[str, list[str]]:
        """Ids of the requests held here (queued or in flight) by the API pod waiting for them (HttpReply only). O(held)."""
        out: dict[str, list[str]] = {}
        for entry in self._entries.held():
            reply = entry.request.reply_to
            if isinstance(reply, wire.HttpReply):
                out.setdefault(reply.instance_id, []).append(entry.request.request_id)
        return out

    def deferred_paused(self) -> bool:
        """True once the deferred work queued here fills its buffer: ``deferred_buffer_rounds`` times the slots above the
        reserve of every live worker of its model, so that each batch finds deferred work to fill its empty slots,
        whatever other classes wait. Deferred work of a model without workers neither counts nor adds room: its
        requests still arrive, so that the model's queue shows its demand (the loop's memory bound holds them)."""
        share, queued, room = self.config.deferred_reserved_share, 0, 0
        for model in self._models.values():
            workers = model.pool.workers.values()
            if workers:
                queued += model.queues[DEFERRED].depth
                room += sum(w.max_slots - w.reserved_slots(share) for w in workers)
        return queued >= room * self.config.deferred_buffer_rounds

    # --- forming batches ----------------------------------------------------------------------------------------------

    def _schedule_model(self, model: _Model, now_ms: int, drain: bool, out: list[BatchDispatch]) -> int | None:
        """Dispatch batches of ``model`` while a worker has room and a batch is due; returns when to look again."""
        while model.depth():
            worker = model.pool.best(now_ms)
            if worker is None:
                return model.pool.next_ready_ms()
            room, deferred_room = self._rooms(model, worker, now_ms)
            reason, due_ms = self._due(model, room, deferred_room, now_ms, worker.fixed, drain)
            if reason is None:
                return due_ms
            flight, full = self._take(model, worker, room, deferred_room)
            if not flight.live:
                return None  # every queued tenant is at its in-flight cap: results will wake us
            if reason != "drain" and full:
                reason = "size"
            out.append(self._dispatch(model, worker, flight, reason, now_ms))
        return None

    def _rooms(self, model: _Model, worker: WorkerView, now_ms: int) -> tuple[int, int]:
        """Slots for this batch, and how many of them deferred work may use (never the reserved last ones)."""
        free = worker.free_slots(now_ms)
        room = min(free, self.config.model_max_batch.get(model.name, worker.max_slots) or free)
        deferred = min(room, free - worker.reserved_slots(self.config.deferred_reserved_share))
        return room, max(deferred, 0)

    def _due(
        self, model: _Model, room: int, deferred_room: int, now_ms: int, fixed: bool, drain: bool
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
        if pending >= room or sum(queues[i].size_bytes for i in classes) > self.config.max_batch_bytes:
            return "size", None
        due_ms = min(queues[i].oldest_enqueued_ms() + self._wait_ms(i, fixed, room, pending) for i in classes)
        if fixed and model.busy_until_ms > now_ms:
            due_ms = max(due_ms, self._busy_hold_ms(model, classes, room, pending))
        return ("wait", None) if due_ms <= now_ms else (None, due_ms)

    def _busy_hold_ms(self, model: _Model, classes: list[int], room: int, pending: int) -> int:
        """Until when a batch that is not full waits while another batch of its fixed-time model runs: until that one
        ends, at most ``fixed_engine_busy_wait_ms`` after its oldest request came (shrinking as work piles up, as the
        window does). Under load the model then gets fewer, fuller batches (every later hop pays per batch, not per
        request); a request that finds no batch of its model running (light load) goes at once."""
        oldest_ms = min(model.queues[i].oldest_enqueued_ms() for i in classes)
        bound = self.config.fixed_engine_busy_wait_ms * room // (room + pending)
        return min(model.busy_until_ms, oldest_ms + bound)

    def _wait_ms(self, cls: int, fixed: bool, room: int, pending: int) -> int:
        bound = self._max_wait_ms[cls]
        if fixed:
            bound = max(bound, self.config.fixed_engine_max_wait_ms)
        return bound * room // (room + pending)

    def _take(self, model: _Model, worker: WorkerView, room: int, deferred_room: int) -> tuple[Flight, bool]:
        """Dispatch to ``worker`` up to ``room`` entries in class precedence, fair across tenants, deferred only after
        all others, until the next one would overflow the byte budget. Returns their flight and whether the batch is full
        (count or bytes)."""
        flight = Flight(worker.worker_id)
        budget_bytes = self.config.max_batch_bytes
        for cls, queue in enumerate(model.queues):
            limit = room if cls != DEFERRED else min(room, deferred_room)
            if cls == DEFERRED and any(q.depth for q in model.queues[:DEFERRED]):
                break
            while flight.live < limit and queue.depth:
                entry = queue.peek(self._is_capped, self._park)
                if entry is None:
                    break
                if entry.size_bytes > budget_bytes:
                    return flight, True  # it heads the next batch: nothing behind it may pass it
                queue.take(entry)
                budget_bytes -= entry.size_bytes
                self._entries.transition(entry, DISPATCHED, flight)  # counts the tenant's in-flight cap at once
        return flight, flight.live >= room

    def _dispatch(
        self, model: _Model, worker: WorkerView, flight: Flight, reason: wire.FlushReason, now_ms: int
    ) -> BatchDispatch:
        batch_id = self._next_batch_id()
        requests = [entry.request for entry in flight.entries]
        release_ms = max(r.deadline_ms for r in requests) + self.config.worker_heartbeat_timeout_ms
        heapq.heappush(self._releases, (release_ms, self._batches, flight))
        worker.record_dispatch(batch_id, flight.entries, now_ms)
        model.pool.touch(worker)
        if worker.fixed:
            model.busy_until_ms = max(model.busy_until_ms, worker.busy_until_ms)
        return BatchDispatch(batch_id, worker.worker_id, worker.partition, model.name, requests, reason, now_ms)

    def _redispatch(self, worker: WorkerView, batch: BatchDispatch, entries: list[Entry], now_ms: int) -> BatchDispatch:
        """Part of a refused batch, to the same worker under a new id (its entries stay in flight there)."""
        batch_id = self._next_batch_id()
        worker.record_dispatch(batch_id, entries, now_ms)
        self._model(worker.model).pool.touch(worker)
        return BatchDispatch(
            batch_id,
            worker.worker_id,
            worker.partition,
            batch.model,
            [e.request for e in entries],
            batch.flush_reason,
            batch.formed_ms,
        )

    def _take_back(self, batch: BatchDispatch) -> list[Entry]:
        """Undo the worker's count of a batch that never reached Kafka; its entries still in flight there, in order."""
        worker = self._workers.get(batch.worker_id)
        if worker is not None:
            worker.forget_batch(batch.batch_id)
            self._model(worker.model).pool.touch(worker)
        entries = [self._entries.get(r.request_id) for r in batch.requests]
        return [e for e in entries if e is not None and e.state is DISPATCHED and e.flight.worker_id == batch.worker_id]

    # --- housekeeping -------------------------------------------------------------------------------------------------

    def _expire_workers(self, now_ms: int) -> None:
        liveness = self._liveness
        while liveness and liveness[0][0] <= now_ms:
            _, worker_id = heapq.heappop(liveness)
            worker = self._workers.get(worker_id)
            if worker is not None and worker.last_heard_ms + self.config.worker_heartbeat_timeout_ms < now_ms:
                self._remove_worker(worker)

    def _expire_deadlines(self, now_ms: int) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            entry = heapq.heappop(deadlines)[2]
            if entry.state is QUEUED:
                self._settle_queued(entry)
                self._answer(
                    entry.request, wire.Outcome.EXPIRED, ErrorType.BATCHER_EXPIRED, "deadline passed before dispatch"
                )
        if len(deadlines) > 2 * self._entries.queued + 4096:  # dispatched entries linger until their deadline: compact
            self._deadlines = [item for item in deadlines if item[2].state is QUEUED]
            heapq.heapify(self._deadlines)

    def _release_overdue(self, now_ms: int) -> None:
        # A worker finishes or expires a request by its deadline; without a result seen by then, stop counting it.
        releases = self._releases
        while releases and releases[0][0] <= now_ms:
            for entry in heapq.heappop(releases)[2].entries or ():
                self._release(entry)
        if len(releases) > 2 * self._entries.live_flights + 4096:
            self._releases = [item for item in releases if item[2].live]
            heapq.heapify(self._releases)

    def _next_housekeeping_ms(self) -> int | None:
        tops = [heap[0][0] for heap in (self._deadlines, self._liveness) if heap]
        return min(tops) if tops else None

    def _remove_worker(self, worker: WorkerView) -> None:
        """Forget a silent worker and re-queue, in front, what it holds that is not known finished."""
        self._workers.pop(worker.worker_id, None)
        self._model(worker.model).pool.remove(worker)
        self._requeue(worker.held())

    def _requeue(self, entries: list[Entry]) -> None:
        for old in sorted(entries, key=lambda e: e.seq, reverse=True):  # push_front: last first keeps their order
            self._release(old)
            request = msgspec.structs.replace(old.request, attempt=old.request.attempt + 1)
            entry = Entry(request, self._next_seq(), old.cls, old.cost, old.size_bytes, old.enqueued_ms)
            self._entries.transition(entry, QUEUED)
            self._model(request.model).queues[entry.cls].push_front(entry)
            heapq.heappush(self._deadlines, (request.deadline_ms, entry.seq, entry))

    # --- bookkeeping --------------------------------------------------------------------------------------------------

    def _enqueue(self, entry: Entry) -> None:
        request = entry.request
        self._entries.transition(entry, QUEUED)
        weight = self.config.tenant_weights.get(entry.tenant, 1.0)
        model = self._models.get(request.model) or self._model(request.model)
        model.queues[entry.cls].push(entry, weight)
        heapq.heappush(self._deadlines, (request.deadline_ms, entry.seq, entry))

    def _settle_queued(self, entry: Entry) -> None:
        """A queued entry leaves without dispatch (cancel, expiry, result seen)."""
        self._entries.transition(entry, DONE)
        self._models[entry.request.model].queues[entry.cls].discard(entry)

    def _release(self, entry: Entry) -> None:
        """An in-flight entry is finished (or handed back): free its worker's slot and its tenant's count."""
        if entry.state is not DISPATCHED:
            return
        self._entries.transition(entry, DONE)
        worker = self._workers.get(entry.flight.worker_id)
        if worker is not None:
            worker.release(entry.request.request_id)
        tenant = entry.tenant
        if tenant in self._parked and not self._is_capped(tenant):
            for queue in self._parked.pop(tenant):
                queue.activate(tenant)

    def _is_capped(self, tenant: str) -> bool:
        return self._entries.tenant_inflight(tenant) >= self.config.tenant_max_inflight

    def _park(self, tenant: str, queue: FairQueue) -> None:
        self._parked.setdefault(tenant, []).append(queue)

    def _answer(
        self,
        request: wire.GenerationRequest,
        outcome: wire.Outcome,
        error_type: str,
        message: str,
        retryable: bool = False,
        code: str | None = None,
    ) -> AddStatus:
        self._answers.append(Answer(request, outcome, error_type, message, retryable, code))
        return AddStatus.ANSWERED

    def _remember_cancel(self, request_id: str, reason: str) -> None:
        self._recent_cancels[request_id] = reason
        if len(self._recent_cancels) > self.config.recent_cancels_max:
            self._recent_cancels.popitem(last=False)

    def _model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = _Model(name)
        return model

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _next_batch_id(self) -> str:
        self._batches += 1
        return f"{self.config.batch_id_prefix}-{self._batches}"

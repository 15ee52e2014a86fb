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

Its parts: fleet.py (models, their queues and live workers), forming.py (when a batch flushes and what it takes),
flights.py (batches out: the worker and tenant in-flight counts); this class turns events into their moves.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from llmq_batcher.classes import CLASS_KEYS, class_index
from llmq_batcher.entries import DISPATCHED, DONE, QUEUED, Entry, EntryTable
from llmq_batcher.fleet import Fleet
from llmq_batcher.flights import BatchDispatch, Flights
from llmq_batcher.forming import BatchFormer
from llmq_batcher.ledger import Grant
from llmq_batcher.prefix_index import PrefixIndex
from llmq_batcher.workers import LeadSteps
from llmq_core import constants, wire
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType

# With CLASS_KEYS, class_index (classes.py) and BatchDispatch (flights.py): the loop and the simulator import them here.
__all__ = [
    "CLASS_KEYS",
    "ENTRY_SLACK_BYTES",
    "AddStatus",
    "Answer",
    "BatchDispatch",
    "BatchPolicy",
    "Decision",
    "PolicyConfig",
    "class_index",
    "estimated_tokens",
]

# What a request's encoding may grow by after it is measured: a traceparent written at flush (57 bytes), a larger attempt.
ENTRY_SLACK_BYTES = 64


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
    fixed_engine_busy_wait_ms: int = 0  # see BatchFormer._busy_hold_ms
    fixed_engine_leads_ms: tuple[int, ...] = ()  # per CLASS_KEYS entry, see workers.LeadSteps (empty: none)
    prefix_routing: bool = True  # see prefix_route.py
    prefix_affinity_max_load: float = 0.75
    prefix_index_ttl_ms: int = 5000
    max_continuations: int = 3  # see llmq_core.continuation

    @classmethod
    def from_settings(cls, settings: Settings, batch_id_prefix: str) -> PolicyConfig:
        """The policy's configuration from service settings; batch ids are ``<batch_id_prefix>-<n>``."""
        batcher = settings.batcher
        return cls(
            max_wait_ms=batcher.max_wait_ms(),
            fixed_engine_max_wait_ms=batcher.fixed_engine_max_wait_ms,
            fixed_engine_busy_wait_ms=batcher.fixed_engine_busy_wait_ms,
            fixed_engine_leads_ms=tuple(batcher.fixed_engine_leads_ms) if batcher.shared_capacity else (),
            worker_heartbeat_timeout_ms=batcher.worker_heartbeat_timeout_ms,
            max_queued=batcher.max_queued,
            deferred_reserved_share=batcher.deferred_reserved_share,
            deferred_buffer_rounds=batcher.deferred_buffer_rounds,
            tenant_max_inflight=batcher.tenant_max_inflight,
            tenant_weights=dict(batcher.tenant_weights),
            batch_id_prefix=batch_id_prefix,
            prefix_routing=batcher.prefix_routing,
            prefix_affinity_max_load=batcher.prefix_affinity_max_load,
            prefix_index_ttl_ms=batcher.prefix_index_ttl_ms,
            max_continuations=batcher.max_continuations,
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


class BatchPolicy:
    """The batcher's decisions. Not thread-safe. Events cost O(log n) per request touched; schedule() adds O(models)."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._entries = EntryTable()
        prefixes = PrefixIndex(config.prefix_index_ttl_ms)
        self._fleet = Fleet(config.worker_heartbeat_timeout_ms, LeadSteps(config.fixed_engine_leads_ms), prefixes)
        self._flights = Flights(
            self._entries,
            self._fleet,
            batch_id_prefix=config.batch_id_prefix,
            grace_ms=config.worker_heartbeat_timeout_ms,
            tenant_max_inflight=config.tenant_max_inflight,
        )
        self._former = BatchFormer(config, self._entries, self._flights, prefixes)
        self._deadlines: list[tuple[int, int, Entry]] = []  # queued entries by deadline (lazy)
        self._recent_cancels: OrderedDict[str, str] = OrderedDict()
        self._answers: list[Answer] = []
        self._dropped: list[str] = []
        self._seq = 0

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

    def awaits_arrival(self, request_id: str) -> bool:
        """Whether a cancel of ``request_id`` is remembered for its arrival (it came before the request did)."""
        return request_id in self._recent_cancels

    def on_heartbeat(self, hb: wire.WorkerHeartbeat, now_ms: int) -> None:
        """Learn a worker's capacity from a heartbeat received at ``now_ms``; a new worker joins its model's pool, one
        that changed model or partition rejoins (what it held is re-queued in front)."""
        orphaned, finished = self._fleet.heartbeat(hb, now_ms)
        self._requeue(orphaned)
        for entry in finished:
            self._flights.release(entry)

    def on_prefix_summary(self, summary: wire.PrefixSummary, now_ms: int) -> None:
        """Learn what a live worker's prompt cache holds from its summary received at ``now_ms`` (see prefix_index.py)."""
        worker = self._fleet.workers.get(summary.worker_id)
        self._fleet.prefixes.summary(summary, worker.model if worker is not None else None, now_ms)

    @property
    def prefixes(self) -> PrefixIndex:
        """What the live workers' caches hold, as this batcher knows it."""
        return self._fleet.prefixes

    def on_result(self, request_id: str, tenant_id: str | None = None) -> None:
        """A final result for ``request_id`` exists (from llmq.results): free its in-flight slot; a queued copy of it
        (re-queued or redelivered) is dropped and reported in ``Decision.dropped``. ``tenant_id`` given (the result's):
        one of another tenant than the request's is no result of it (a principal that may write llmq.results, a
        worker's, must not drop another tenant's queued request with a forged record)."""
        entry = self._entries.get(request_id)
        if entry is None or (tenant_id is not None and tenant_id != entry.tenant):
            return
        if entry.state is DISPATCHED:
            self._flights.release(entry)
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
        self._requeue(self._flights.take_back(batch))
        model = self._fleet.model(batch.model)
        model.hold_until_ms = max(model.hold_until_ms, now_ms + retry_in_ms)

    def claimed(self, batch: BatchDispatch, grant: Grant) -> BatchDispatch | None:
        """The fleet's capacity ledger granted ``batch`` its first ``grant.granted`` requests: returns the batch to
        produce (None: nothing granted). The rest go back to the front of their queues unchanged, and the worker's view
        follows the ledger (a fixed-time worker's next window with room)."""
        worker = self._fleet.workers.get(batch.worker_id)
        if worker is not None:
            worker.follow(grant.next_ms, grant.next_room)
            self._fleet.touch(worker)
        if grant.granted >= len(batch.requests):
            return batch
        if grant.granted <= 0:
            self._requeue(self._flights.take_back(batch), retry=False)
            return None
        kept, dropped = self._flights.shrink(batch, grant.granted)
        self._requeue(dropped, retry=False)
        return kept

    def claim_failed(self, batch: BatchDispatch, now_ms: int, retry_in_ms: int) -> None:
        """The ledger could not be asked (Redis slow or down): ``batch`` goes back to its queues unsent and its model
        forms no batch for ``retry_in_ms``."""
        self._requeue(self._flights.take_back(batch), retry=False)
        model = self._fleet.model(batch.model)
        model.hold_until_ms = max(model.hold_until_ms, now_ms + retry_in_ms)

    def split(self, batch: BatchDispatch, now_ms: int) -> list[BatchDispatch]:
        """The record of ``batch`` was refused as too large: the same worker gets its requests as two batches (new ids,
        in order). Requests no longer in flight there are left out; fewer than two come back as one batch."""
        return self._flights.split(batch, now_ms)

    def fail(self, batch: BatchDispatch, error_type: str, message: str, code: str) -> None:
        """The record of ``batch`` can never be produced: answer its requests errored (not retryable) in the next
        decision."""
        for entry in self._flights.take_back(batch):
            self._flights.release(entry)
            self._answer(entry.request, wire.Outcome.ERRORED, error_type, message, code=code)

    # --- decisions ----------------------------------------------------------------------------------------------------

    def schedule(self, now_ms: int, drain: bool = False) -> Decision:
        """Decide at ``now_ms``: expire, form and route batches. ``drain`` flushes every batch that has a worker,
        ignoring wait windows (shutdown)."""
        for held in self._fleet.expire(now_ms):
            self._requeue(held)
        self._expire_deadlines(now_ms)
        self._flights.release_overdue(now_ms)
        batches: list[BatchDispatch] = []
        wakes = [self._next_housekeeping_ms()]
        for model in self._fleet.models.values():
            if model.hold_until_ms > now_ms and not drain:
                wakes.append(model.hold_until_ms)
            elif model.depth():
                wakes.append(self._former.form(model, now_ms, drain, batches))
        answers, self._answers = self._answers, []
        dropped, self._dropped = self._dropped, []
        future = [t for t in wakes if t is not None and t > now_ms]
        return Decision(batches, answers, dropped, min(future) if future else None, self.load(now_ms))

    def load(self, now_ms: int) -> dict[str, wire.QueueLoad]:
        """Queue depth and oldest queued age (ms) per class, over all models."""
        return self._fleet.load(now_ms)

    def model_states(self, now_ms: int) -> dict[str, wire.ModelLoad]:
        """Every model seen (in a request or a heartbeat) -> its queues, live workers, their slots and capacity, and
        last worker heartbeat (drain rates are the loop's to fill in)."""
        return self._fleet.model_states(now_ms)

    def requests_by_pod(self) -> dict[str, list[wire.GenerationRequest]]:
        """The requests held here (queued or in flight) by the API pod waiting for them (HttpReply only). O(held)."""
        out: dict[str, list[wire.GenerationRequest]] = {}
        for entry in self._entries.held():
            reply = entry.request.reply_to
            if isinstance(reply, wire.HttpReply):
                out.setdefault(reply.instance_id, []).append(entry.request)
        return out

    def deferred_paused(self) -> bool:
        """True once the deferred work queued here fills its buffer: ``deferred_buffer_rounds`` times the slots above the
        reserve of every live worker of its model, so that each batch finds deferred work to fill its empty slots,
        whatever other classes wait. Deferred work of a model without workers neither counts nor adds room: its
        requests still arrive, so that the model's queue shows its demand (the loop's memory bound holds them)."""
        return self._fleet.deferred_paused(self.config.deferred_reserved_share, self.config.deferred_buffer_rounds)

    # --- housekeeping -------------------------------------------------------------------------------------------------

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

    def _next_housekeeping_ms(self) -> int | None:
        tops = (self._deadlines[0][0] if self._deadlines else None, self._fleet.next_expiry_ms())
        return min((t for t in tops if t is not None), default=None)

    def _requeue(self, entries: list[Entry], retry: bool = True) -> None:
        """Back to the front of their queues; ``retry``: they may have reached a worker (a new attempt)."""
        for old in sorted(entries, key=lambda e: e.seq, reverse=True):  # push_front: last first keeps their order
            self._flights.release(old)
            request = msgspec.structs.replace(old.request, attempt=old.request.attempt + 1) if retry else old.request
            entry = Entry(request, self._next_seq(), old.cls, old.cost, old.size_bytes, old.enqueued_ms)
            entry.chains = old.chains  # its prompt is unchanged: no hashing again
            self._entries.transition(entry, QUEUED)
            self._fleet.model(request.model).queues[entry.cls].push_front(entry)
            heapq.heappush(self._deadlines, (request.deadline_ms, entry.seq, entry))

    # --- bookkeeping --------------------------------------------------------------------------------------------------

    def _enqueue(self, entry: Entry) -> None:
        request = entry.request
        self._entries.transition(entry, QUEUED)
        weight = self.config.tenant_weights.get(entry.tenant, 1.0)
        model = self._fleet.models.get(request.model) or self._fleet.model(request.model)
        model.queues[entry.cls].push(entry, weight)
        heapq.heappush(self._deadlines, (request.deadline_ms, entry.seq, entry))

    def _settle_queued(self, entry: Entry) -> None:
        """A queued entry leaves without dispatch (cancel, expiry, result seen)."""
        self._entries.transition(entry, DONE)
        self._fleet.models[entry.request.model].queues[entry.cls].discard(entry)

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

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

"""The worker's policy, free of I/O: takes Batches, drives the engine, turns engine events into wire messages.

:class:`WorkerCore` decides what to submit (deadlines, cancellations, duplicates, poison isolation) and returns an
:class:`Outbox` of messages (written by answers.py); the loop publishes them and then calls :meth:`WorkerCore.release`
so that offsets are committed only for batches whose requests are all final and delivered.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from llmq_core.clock import Clock
from llmq_core.constants import replies_channel
from llmq_core.settings import WorkerSettings
from llmq_core.status import ErrorType
from llmq_core.telemetry import request_fields
from llmq_core.wire import (
    Batch,
    ErrorInfo,
    FinalResult,
    HttpReply,
    Outcome,
    Progress,
    StreamMark,
    TokenChunk,
    Usage,
    WorkerHeartbeat,
)
from llmq_worker.answers import (
    MAX_RESULT_RECORD_BYTES,
    POISON_ERROR,
    Active,
    AnswerWriter,
    event_timings,
    interrupted_error,
    streams,
)
from llmq_worker.engine import ChunkEvent, Engine, EngineEvent, FinalEvent, InvalidRequest
from llmq_worker.isolation import Isolator
from llmq_worker.offsets import OffsetTracker

log = logging.getLogger(__name__)

REASON_DEADLINE = "deadline"
REASON_SHUTDOWN = "shutdown"
REMEMBERED_IDS = 100_000  # cancels that arrived before their request, and finished request ids (duplicate suppression)


@dataclass
class Outbox:
    """What the loop must send: ``replies`` (Redis channel, message) in order, ``results`` for llmq.results, and the batch
    ``offsets`` (one entry per finished request) to pass to :meth:`WorkerCore.release` once both are delivered.
    ``marks``: (request_id, StreamMark, ttl_ms) to SET at ``constants.streamed_key`` and ``progress``: (request_id,
    Progress, ttl_ms: None once set) to RPUSH at ``constants.progress_key`` and ``stream_log``: (request_id, encoded
    TokenChunk, ttl_ms: None once set) to RPUSH at ``constants.stream_log_key``, all before the replies are published;
    ``forget``: the request ids whose progress key goes once their results are out."""

    replies: list[tuple[str, TokenChunk | FinalResult]] = field(default_factory=list)
    results: list[FinalResult] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    marks: list[tuple[str, StreamMark, int]] = field(default_factory=list)
    progress: list[tuple[str, Progress, int | None]] = field(default_factory=list)
    stream_log: list[tuple[str, bytes, int | None]] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)

    def extend(self, other: Outbox) -> None:
        self.replies += other.replies
        self.results += other.results
        self.offsets += other.offsets
        self.marks += other.marks
        self.progress += other.progress
        self.stream_log += other.stream_log
        self.forget += other.forget

    def __bool__(self) -> bool:
        return bool(self.replies or self.results or self.offsets or self.redis_writes)

    @property
    def redis_writes(self) -> bool:
        """Whether anything goes to Redis besides the replies."""
        return bool(self.marks or self.progress or self.stream_log or self.forget)


class WorkerCore:
    """Per-worker state machine. Not thread-safe; call from one asyncio loop."""

    def __init__(
        self,
        *,
        worker_id: str,
        partition: int,
        model: str,
        engine: Engine,
        clock: Clock,
        max_record_bytes: int = MAX_RESULT_RECORD_BYTES,
        stream_log_max_bytes: int = WorkerSettings.model_fields["stream_log_max_bytes"].default,
    ) -> None:
        """``max_record_bytes``: the encoded size of a FinalResult that still fits one llmq.results record;
        ``stream_log_max_bytes``: a resumable stream's chunks kept in its log per run (``worker.stream_log_max_bytes``)."""
        self.worker_id = worker_id
        self.partition = partition
        self.model = model
        self.last_batch_id = ""
        self._engine = engine
        self._clock = clock
        self._writer = AnswerWriter(worker_id, clock, max_record_bytes, stream_log_max_bytes)
        self._active: dict[str, Active] = {}
        self._held: collections.deque[str] = (
            collections.deque()
        )  # taken, not submitted yet (e.g. while suspects run alone)
        self._isolator = Isolator()
        self._offsets = OffsetTracker()
        self._cancels: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._finished: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()

    # --- inputs ------------------------------------------------------------------------------------------------------

    def take_batch(self, batch: Batch, offset: int, marks: dict[str, StreamMark] | None = None) -> Outbox:
        """Start every request of ``batch`` (read at ``offset``); answers expired/canceled/invalid ones at once.

        ``marks``: the StreamMarks found for streaming requests of the batch (see :func:`streams`). One whose text
        already reached its caller runs only as a continuation (its request carries the tokens generated so far, and
        the API pod joins the two attempts' text); without one it is answered ``stream_interrupted`` and not run
        again (one generation per stream). One whose mark is ``done`` already has its result out; one whose mark is
        of a later attempt streams elsewhere (this is a lost attempt's record, read again by its partition's next
        worker)."""
        self.last_batch_id = batch.batch_id
        self._offsets.add(offset, len(batch.requests))
        marks = marks or {}
        out = Outbox()
        for request in batch.requests:
            mark = marks.get(request.request_id)
            if (request.request_id, request.attempt) in self._finished or (mark is not None and mark.done):
                out.offsets.append(offset)  # a redelivered duplicate: its result is already out
            elif mark is not None and mark.attempt > request.attempt:
                out.offsets.append(offset)  # a lost attempt's record read again: a later attempt streams it
            elif request.request_id in self._active:
                self._active[request.request_id].offsets.append(offset)
            elif mark is not None and request.continuation is None:
                active = self._active[request.request_id] = Active(request, [offset], len(batch.requests))
                out.extend(self._interrupted(active, mark.completion_tokens))
            else:
                self._active[request.request_id] = Active(request, [offset], len(batch.requests))
                self._held.append(request.request_id)
        out.extend(self._submit_held())
        return out

    def skip(self, offset: int) -> None:
        """A record at ``offset`` that is no Batch: nothing to run, it may be committed."""
        self._offsets.add(offset, 0)

    def cancel(self, request_id: str, reason: str) -> Outbox:
        """Obey a Cancel: a running request is aborted (its FinalEvent follows), a waiting one ends now, an unknown one
        is remembered in case its batch is still on the way."""
        active = self._active.get(request_id)
        if active is None:
            self._remember(self._cancels, request_id, reason)
            return Outbox()
        return self._abort(active, reason)

    def expire_overdue(self) -> Outbox:
        """Abort every request whose deadline has passed (outcome ``expired``). Call periodically."""
        now = self._clock.now_ms()
        out = Outbox()
        for active in list(self._active.values()):
            if active.request.deadline_ms <= now and active.cancel_reason is None:
                out.extend(self._abort(active, REASON_DEADLINE))
        return out

    def abandon_all(self) -> None:
        """Shutdown: abort everything without answering; the uncommitted batches are redelivered to the next worker."""
        for active in list(self._active.values()):
            active.cancel_reason = REASON_SHUTDOWN
            if active.submitted:
                self._engine.cancel(active.request.request_id)
            else:
                del self._active[active.request.request_id]
        self._held.clear()

    def flush_progress(self) -> Outbox:
        """The Progress frames of every request's tokens generated since its last ones (a stream's text already went
        out with its own). Call every ``worker.progress_interval_ms``."""
        out = Outbox()
        for active in self._active.values():
            if active.generated.unwritten:
                out.progress += self._writer.progress(active)
        return out

    def on_events(self, events: list[EngineEvent]) -> Outbox:
        """Turn engine events into TokenChunks and FinalResults; runs the next isolation step when the engine is idle."""
        out = Outbox()
        for event in events:
            active = self._active.get(event.request_id)
            if active is None or not active.submitted:
                continue  # late event of a request already answered
            if isinstance(event, ChunkEvent):
                out.extend(self._chunk(active, event))
            else:
                out.extend(self._final_event(active, event))
        out.extend(self._submit_held())
        return out

    def release(self, offsets: list[int]) -> int | None:
        """Results of an Outbox are delivered: returns the offset to commit now, or None if it did not advance."""
        for offset in offsets:
            self._offsets.release(offset)
        return self._offsets.commit_offset()

    # --- state -------------------------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Requests taken and not yet final (running, queued in the engine, or held)."""
        return len(self._active)

    def heartbeat(self, now_ms: int, context_window: int) -> WorkerHeartbeat:
        """This worker's capacity as a WorkerHeartbeat (held requests count as queued)."""
        capacity = self._engine.capacity()
        queued = capacity.queued + sum(1 for a in self._active.values() if not a.submitted)
        return WorkerHeartbeat(
            worker_id=self.worker_id,
            partition=self.partition,
            model=self.model,
            max_slots=capacity.max_slots,
            running=capacity.running,
            queued=queued,
            free_slots=max(0, capacity.max_slots - capacity.running - queued),
            est_drain_ms=capacity.est_drain_ms,
            sent_ms=now_ms,
            fixed_batch_time_ms=self._engine.fixed_batch_time_ms,
            context_window=context_window,
            last_batch_id=self.last_batch_id,
            preemptible=capacity.preemptible,
        )

    # --- internals ---------------------------------------------------------------------------------------------------

    def _submit_held(self) -> Outbox:
        out = Outbox()
        while self._isolator.active:
            if any(a.submitted for a in self._active.values()):
                return out  # suspects run alone: wait until the engine is idle
            culprits, group = self._isolator.next_step()
            for request_id in culprits:
                out.extend(self._culprit(self._active[request_id]))
            for request_id in group:
                if request_id in self._active:
                    out.extend(self._start(self._active[request_id]))
        while self._held:
            request_id = self._held.popleft()
            if request_id in self._active:
                out.extend(self._start(self._active[request_id]))
        return out

    def _start(self, active: Active) -> Outbox:
        request = active.request
        now = self._clock.now_ms()
        reason = active.cancel_reason or self._cancels.get(request.request_id)
        if reason is not None or request.deadline_ms <= now:
            return self._answer(active, Outcome.CANCELED if reason not in (None, REASON_DEADLINE) else Outcome.EXPIRED)
        if request.model != self.model:
            error = ErrorInfo(
                type=ErrorType.MODEL_MISMATCH,
                message=f"worker serves {self.model}, not {request.model}",
                retryable=True,
            )
            return self._answer(active, Outcome.ERRORED, error=error)
        try:
            self._engine.submit(request)
        except InvalidRequest as exc:
            return self._answer(
                active,
                Outcome.ERRORED,
                error=ErrorInfo(type=ErrorType.INVALID_REQUEST, message=str(exc), param=exc.param, code=exc.code),
            )
        active.submitted = True
        return Outbox()

    def _abort(self, active: Active, reason: str) -> Outbox:
        if active.cancel_reason is not None:
            return Outbox()
        active.cancel_reason = reason
        if active.submitted:
            self._engine.cancel(active.request.request_id)
            return Outbox()
        self._isolator.forget(active.request.request_id)
        outcome = Outcome.EXPIRED if reason == REASON_DEADLINE else Outcome.CANCELED
        return self._answer(active, outcome)

    def _chunk(self, active: Active, event: ChunkEvent) -> Outbox:
        request = active.request
        active.generated.add(event.index, event.token_ids)
        if not event.text or not streams(request):
            return Outbox()
        chunk = self._writer.chunk(active, event)
        logged = self._writer.log_entry(active, chunk)
        return Outbox(
            replies=[(replies_channel(request.reply_to.instance_id), chunk)],
            marks=[self._writer.mark(active)],
            progress=self._writer.progress(active),  # the ids of the text sent, and of what it holds back
            stream_log=[logged] if logged is not None else [],
        )

    def _interrupted(self, active: Active, completion_tokens: int) -> Outbox:
        """Answer a streaming request whose attempt was lost after its text reached the caller: running it again would
        send text of a second generation. Usage counts the tokens the caller received."""
        active.sent_tokens = completion_tokens
        usage = Usage.of(active.request.prompt_tokens, completion_tokens)
        return self._answer(active, Outcome.ERRORED, error=interrupted_error(completion_tokens), usage=usage)

    def _final_event(self, active: Active, event: FinalEvent) -> Outbox:
        active.submitted = False
        if active.cancel_reason == REASON_SHUTDOWN:
            del self._active[active.request.request_id]
            return Outbox()
        if event.shared_failure and event.outcome is Outcome.ERRORED:
            if active.sent_tokens is not None:  # an isolated re-run would be a second generation of its stream
                return self._interrupted(active, active.sent_tokens)
            self._isolator.failed(active.request.request_id)
            return Outbox()
        outcome = event.outcome
        if outcome is Outcome.CANCELED and active.cancel_reason == REASON_DEADLINE:
            outcome = Outcome.EXPIRED
        return self._answer(
            active,
            outcome,
            choices=event.choices,
            usage=event.usage,
            timings=event_timings(active.request, event),
            error=event.error,
            finished_ms=event.finished_ms,
        )

    def _culprit(self, active: Active) -> Outbox:
        log.warning(
            "request failed the engine alone: answering errored",
            extra=request_fields(active.request.request_id, active.request.traceparent),
        )
        return self._answer(active, Outcome.ERRORED, error=POISON_ERROR)

    def _answer(self, active: Active, outcome: Outcome, **fields) -> Outbox:
        """Settle ``active`` with its FinalResult (``fields``: :meth:`AnswerWriter.result`'s)."""
        request = active.request
        result = self._writer.result(active, outcome, **fields)
        del self._active[request.request_id]
        self._cancels.pop(request.request_id, None)
        self._remember(self._finished, (request.request_id, request.attempt), None)
        out = Outbox(results=[result], offsets=list(active.offsets))
        if active.sent_tokens is not None:  # written after the result is produced: replays of it are duplicates
            out.marks.append(self._writer.mark(active, done=True))
        if active.generated.wrote:
            out.forget.append(request.request_id)
        if isinstance(request.reply_to, HttpReply):
            out.replies.append((replies_channel(request.reply_to.instance_id), result))
        return out

    @staticmethod
    def _remember(memory: collections.OrderedDict, key, value) -> None:
        memory[key] = value
        memory.move_to_end(key)
        while len(memory) > REMEMBERED_IDS:
            memory.popitem(last=False)

"""How the worker's answers are written: stream chunks, stream marks and final results (fitted to one record).

:class:`~llmq_worker.core.WorkerCore` decides when a request is answered and with what outcome; :class:`AnswerWriter`
turns that into wire messages, so the core holds no message layout and the writer no request state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import msgspec

from llmq_core import wire
from llmq_core.clock import Clock
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, RECORD_HEADROOM_BYTES, TOPIC_RESULTS
from llmq_core.status import ErrorCode, ErrorType
from llmq_core.stream_log import resumable
from llmq_core.telemetry import request_fields
from llmq_core.tokenizer import count_tokens
from llmq_core.wire import (
    ErrorInfo,
    FinalResult,
    GenerationRequest,
    HttpReply,
    Outcome,
    StreamMark,
    Timings,
    TokenChunk,
)
from llmq_worker.engine import ChunkEvent, FinalEvent
from llmq_worker.progress import Generated

log = logging.getLogger(__name__)

MAX_RESULT_RECORD_BYTES = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES  # an encoded FinalResult, at most
STREAM_MARK_GRACE_MS = 30_000  # a stream mark outlives its request's deadline by this much (clock skew between hosts)
POISON_ERROR = ErrorInfo(
    type=ErrorType.ENGINE, message="this request made the engine fail", code=ErrorCode.POISON, retryable=False
)


def streams(request: GenerationRequest) -> bool:
    """Whether ``request``'s text goes to its caller chunk by chunk (only HTTP callers stream)."""
    return request.stream and isinstance(request.reply_to, HttpReply)


def refused_result(result: FinalResult, code: str, message: str) -> FinalResult:
    """The errored outcome that stands in for ``result`` when llmq.results cannot take it (too large, or refused for
    good): its choices are dropped (they are what did not fit), its usage and timings kept (the work was done)."""
    error = ErrorInfo(type=ErrorType.SERVER, message=message, code=code, retryable=False)
    return msgspec.structs.replace(result, outcome=Outcome.ERRORED, choices=[], error=error)


def interrupted_error(completion_tokens: int) -> ErrorInfo:
    """The error of a streaming request whose attempt was lost after ``completion_tokens`` reached its caller."""
    return ErrorInfo(
        type=ErrorType.SERVER,
        code=ErrorCode.STREAM_INTERRUPTED,
        retryable=True,
        message=f"The stream was interrupted after {completion_tokens} tokens: the worker generating "
        "it was lost, and continuing would mix two generations. Retry the request.",
    )


def event_timings(request: GenerationRequest, event: FinalEvent) -> Timings:
    """The timings of a request the engine finished, in ms after its ``created_ms``."""
    created = request.created_ms
    return Timings(
        queued_ms=max(0, event.started_ms - created) if event.started_ms else max(0, event.finished_ms - created),
        ttft_ms=max(0, event.first_token_ms - created) if event.first_token_ms else 0,
        total_ms=max(0, event.finished_ms - created),
    )


@dataclass
class Active:
    """A request taken and not final: the batch ``offsets`` it was read at, whether the engine runs it, and (streaming)
    the chunks and tokens of text its caller got."""

    request: GenerationRequest
    offsets: list[int]
    batch_size: int
    submitted: bool = False
    cancel_reason: str | None = None
    seq: int = 0
    sent_tokens: int | None = None  # streaming: tokens of text published to the caller (None: nothing yet)
    generated: Generated = field(init=False)  # token ids per choice, for another worker to continue from
    chars: dict[int, int] = field(default_factory=dict)  # streaming: characters of each choice's text sent
    logged_bytes: int = 0  # a resumable stream: bytes of its chunks in its stream log (past the bound: none more)

    def __post_init__(self) -> None:
        self.generated = Generated(self.request.continuation)


class AnswerWriter:
    """Writes the messages of worker ``worker_id``; ``max_record_bytes``: the encoded size of a FinalResult that still
    fits one llmq.results record."""

    def __init__(self, worker_id: str, clock: Clock, max_record_bytes: int, stream_log_max_bytes: int = 0) -> None:
        """``stream_log_max_bytes``: the bytes of one resumable stream's chunks its log keeps per run."""
        self._worker_id = worker_id
        self._clock = clock
        self._max_record_bytes = max_record_bytes
        self._stream_log_max_bytes = stream_log_max_bytes

    def chunk(self, active: Active, event: ChunkEvent) -> TokenChunk:
        """The next TokenChunk of ``active``'s stream, counted as sent (its seq and tokens)."""
        request = active.request
        active.sent_tokens = (active.sent_tokens or 0) + count_tokens(event.text)
        offset = active.chars.get(event.index, 0)
        active.chars[event.index] = offset + len(event.text)
        chunk = TokenChunk(
            request_id=request.request_id,
            index=event.index,
            text=event.text,
            seq=active.seq,
            sent_ms=self._clock.now_ms(),
            attempt=request.attempt,
            tenant_id=request.tenant_id,
            logprobs=event.logprobs,
            offset=offset,
        )
        active.seq += 1
        return chunk

    def log_entry(self, active: Active, chunk: TokenChunk) -> tuple[str, bytes, int | None] | None:
        """The stream-log entry of ``chunk`` of a resumable stream (see ``llmq_core.stream_log``): (request_id, encoded
        chunk, ttl_ms: None once set); None for another request, or once its log holds its bound (no later chunk is
        logged either: a log has no gaps)."""
        if not resumable(active.request) or active.logged_bytes > self._stream_log_max_bytes:
            return None
        data = wire.encode(chunk)
        ttl_ms = None if active.logged_bytes else self._ttl_ms(active.request)
        active.logged_bytes += len(data)
        if active.logged_bytes > self._stream_log_max_bytes:
            return None
        return active.request.request_id, data, ttl_ms

    def mark(self, active: Active, done: bool = False) -> tuple[str, StreamMark, int]:
        """The StreamMark of a request whose text reached its caller, kept until its deadline has surely passed:
        (request_id, mark, ttl_ms)."""
        request = active.request
        return (
            request.request_id,
            StreamMark(attempt=request.attempt, completion_tokens=active.sent_tokens or 0, done=done),
            self._ttl_ms(request),
        )

    def progress(self, active: Active) -> list[tuple[str, wire.Progress, int | None]]:
        """The Progress frames of ``active``'s ids not written yet: (request_id, frame, ttl_ms), their key kept as long
        as its stream mark; ttl_ms None once this worker set the key's expiry (its first frames did: the deadline
        does not move)."""
        request = active.request
        ttl_ms = None if active.generated.wrote else self._ttl_ms(request)
        return [(request.request_id, frame, ttl_ms) for frame in active.generated.frames(request.attempt)]

    def _ttl_ms(self, request: GenerationRequest) -> int:
        return max(request.deadline_ms - self._clock.now_ms(), 0) + STREAM_MARK_GRACE_MS

    def result(
        self, active: Active, outcome: Outcome, *, finished_ms: int | None = None, timings=None, **fields
    ) -> FinalResult:
        """``active``'s FinalResult (finished now unless ``finished_ms``; ``fields``: FinalResult's), or its errored
        stand-in when it would not fit one record."""
        request = active.request
        finished_ms = finished_ms or self._clock.now_ms()
        result = FinalResult.for_request(
            request,
            outcome,
            finished_ms=finished_ms,
            timings=timings or wire.queued_timings(request.created_ms, finished_ms),
            worker_id=self._worker_id,
            batch_size=active.batch_size,
            **fields,
        )
        return self._fitting(result)

    def _fitting(self, result: FinalResult) -> FinalResult:
        """``result``, or its errored stand-in when it would not fit one record: settled before anything is published,
        so the caller's answer and llmq.results carry the same outcome."""
        size = len(wire.encode(result))
        if size <= self._max_record_bytes:
            return result
        log.error(
            "result of %d bytes exceeds the record limit of %d: answering errored",
            size,
            self._max_record_bytes,
            extra=request_fields(result.request_id),
        )
        return refused_result(
            result,
            ErrorCode.RESULT_TOO_LARGE,
            f"the result ({size} bytes encoded) exceeds the {self._max_record_bytes} bytes one record"
            f" of {TOPIC_RESULTS} carries",
        )

"""llmq's one status vocabulary: how a request ends (:class:`Outcome`, on the wire), the error types and codes its
errors carry (:class:`ErrorType`, :class:`ErrorCode`), and the ``outcome`` label of request metrics
(:class:`OutcomeLabel`, :func:`outcome_label`).

A module of its own, beneath :mod:`llmq_core.wire` (which re-exports :class:`Outcome`): every service, the CLI and the
benchmarks compare against these values, and most of them need no wire message to do so. ``ErrorType`` and
``ErrorCode`` are ``StrEnum``s: a member is the plain string it names, so ``wire.ErrorInfo.type`` / ``.code`` stay
``str`` on the wire and a value from any producer compares equal. Error codes only the API pods answer over HTTP
(``invalid_json``, ``file_too_large``, ...) stay with the API; the codes here reach a ``FinalResult`` or pass
between packages. Batch statuses (OpenAI's spelling) and the batch-job ledger's line codes are in :mod:`llmq_jobs.jobs`.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """Terminal outcome of one request. Per-request outcomes spell ``canceled`` (OpenAI batch statuses keep ``cancelled``)."""

    SUCCEEDED = "succeeded"
    ERRORED = "errored"
    CANCELED = "canceled"
    EXPIRED = "expired"


class ErrorType(enum.StrEnum):
    """``type`` of an error object (``wire.ErrorInfo`` and the API's OpenAI-style error bodies). A tenant's rate
    limits answer with their bucket's name (``requests``, ``tokens``), as OpenAI does."""

    INVALID_REQUEST = "invalid_request_error"  # a client mistake: 400 (also 401 invalid_api_key, OpenAI's type)
    PERMISSION = "permission_error"  # the key may not use this traffic class
    RATE_LIMIT = "rate_limit_error"  # 429: admission control, connection caps
    OVERLOADED = "overloaded"  # the batcher's queue is full: the API answers 429 + Retry-After
    TIMEOUT = "timeout_error"  # 504: the deadline passed
    CANCELED = "canceled_error"  # the API's 409 (canceled by the system) and a client that left (499)
    SERVER = "server_error"  # llmq failed the request (500, or 503 when retryable)
    ENGINE = "engine_error"  # a worker's engine failed the request
    MODEL_MISMATCH = "model_mismatch"  # a Batch reached a worker of another model (retryable)
    BATCHER_CANCELED = "canceled"  # the batcher dropped a queued request: its cancel reason is the message
    BATCHER_EXPIRED = "expired"  # the batcher dropped a queued request past its deadline
    BATCH_CANCELLED = "batch_cancelled"  # a batch job's line that never ran: its job was cancelled
    BATCH_EXPIRED = "batch_expired"  # ... or its job's completion window ended


class ErrorCode(enum.StrEnum):
    """``code`` of an error that reaches a ``FinalResult`` or passes between packages (docs/limits.md and
    docs/kafka-producers.md list what a caller may see)."""

    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    OUT_OF_RANGE = "out_of_range"
    STOP_TOO_LONG = "stop_too_long"
    REQUEST_TOO_LARGE = "request_too_large"  # the request does not fit in one Kafka record
    RESULT_TOO_LARGE = "result_too_large"  # max_tokens x n could pass MAX_RESULT_BYTES, or the result did
    RESULT_REFUSED = "result_refused"  # llmq.results refused the result for good
    INVALID_REPLY_TOPIC = "invalid_reply_topic"
    REQUEST_ID_REUSED = "request_id_reused"  # a re-produced Kafka-direct request_id that gets no replay
    DISPATCH_FAILED = "dispatch_failed"  # the batch topic refused the request for good
    POISON = "poison"  # this request made the engine fail (found by bisection)
    STREAM_INTERRUPTED = "stream_interrupted"  # a stream's generation was lost after text of it reached the caller
    TENANT_NOT_ALLOWED = "tenant_not_allowed"  # an ingress record claimed a tenant its producer does not speak for
    CLASS_NOT_ALLOWED = "class_not_allowed"  # a traffic class the caller's key (or ingress grant) may not use
    DEADLINE_EXCEEDED = "deadline_exceeded"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # every 429 of admission control
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    INVALID_VALUE = "invalid_value"  # a value of the right type that is not allowed (any 400 without a closer code)
    TOO_MANY_VALUES = "too_many_values"  # more stop sequences or logit_bias entries than allowed
    BATCH_CANCELLED = ErrorType.BATCH_CANCELLED.value
    BATCH_EXPIRED = ErrorType.BATCH_EXPIRED.value


class OutcomeLabel(enum.StrEnum):
    """Values of the ``outcome`` label of request metrics: a wire :class:`Outcome`'s own name, or an end that no
    FinalResult names."""

    SUCCEEDED = Outcome.SUCCEEDED.value
    ERRORED = Outcome.ERRORED.value
    CANCELED = Outcome.CANCELED.value
    EXPIRED = Outcome.EXPIRED.value
    REJECTED = "rejected"  # refused before it ran: the batcher's full queue, an API pod's 4xx
    CLIENT_ERROR = "client_error"  # errored for what the caller sent (invalid_request_error, permission_error)
    UNAVAILABLE = "unavailable"  # an API pod's 429 or 5xx before anything was produced
    DEADLINE = "deadline"  # an API pod's own timer ran out
    ABANDONED = "abandoned"  # the client left before its answer
    INTERNAL_ERROR = "internal_error"  # an API pod failed unexpectedly


CLIENT_ERROR_TYPES = frozenset({ErrorType.INVALID_REQUEST, ErrorType.PERMISSION})  # the caller must change the request


def outcome_label(outcome: Outcome, error_type: str | None = None) -> OutcomeLabel:
    """The ``outcome`` label of a request answered with ``outcome`` and an error of ``error_type``: a refusal for a
    full queue reads ``rejected``, an error of the caller's own (:data:`CLIENT_ERROR_TYPES`: a bad line of a batch
    job, an unknown model) ``client_error``, which no service level counts as a miss."""
    if outcome is Outcome.ERRORED and error_type == ErrorType.OVERLOADED:
        return OutcomeLabel.REJECTED
    if outcome is Outcome.ERRORED and error_type in CLIENT_ERROR_TYPES:
        return OutcomeLabel.CLIENT_ERROR
    return OutcomeLabel(outcome.value)

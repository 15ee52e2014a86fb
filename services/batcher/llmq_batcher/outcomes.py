"""The FinalResult the batcher sends for a request it answers itself (expired, canceled, overloaded, too large,
refused at entry, a re-produced request_id)."""

from __future__ import annotations

import msgspec

from llmq_batcher.policy import Answer
from llmq_core import wire
from llmq_core.requests import echo
from llmq_core.status import ErrorCode, ErrorType


def final_result(answer: Answer, now_ms: int) -> wire.FinalResult:
    """A terminal result for ``answer.request`` stamped at ``now_ms`` (epoch ms); it never reached a worker."""
    request = answer.request
    error = wire.ErrorInfo(type=answer.error_type, message=answer.message, code=answer.code, retryable=answer.retryable)
    return wire.FinalResult.for_request(
        request,
        answer.outcome,
        finished_ms=now_ms,
        timings=wire.queued_timings(request.created_ms, now_ms),
        error=error,
    )


def reply_topic_refusal(reason: str) -> wire.ErrorInfo:
    """The error of a Kafka-direct request whose reply topic may not receive results (see
    :func:`llmq_core.kafka.reply_topic_error`)."""
    return wire.ErrorInfo(
        type=ErrorType.INVALID_REQUEST, message=reason, code=ErrorCode.INVALID_REPLY_TOPIC, param="reply_to.topic"
    )


def reused_id(request_id: str) -> wire.ErrorInfo:
    """The error of a re-produced ``request_id`` whose first request's result cannot be replayed to it."""
    return _request_id_reused(
        f"The request_id {echo(request_id)} was already used by another request, whose result is not stored (it "
        f"is still running, its stored result is gone, or it was not a Kafka-direct request of this tenant). "
        f"Use a new request_id to run this request."
    )


def reused_id_other_parameters(request_id: str) -> wire.ErrorInfo:
    """The error of a re-produced ``request_id`` whose parameters differ from its first request's: a producer reused
    the id for another request, which must not get the first one's result."""
    return _request_id_reused(
        f"The request_id {echo(request_id)} was already used by a request with different parameters (model, "
        f"endpoint, prompt or messages, sampling); only an exact repeat gets its result. Use a new request_id "
        f"to run this request."
    )


def _request_id_reused(message: str) -> wire.ErrorInfo:
    return wire.ErrorInfo(
        type=ErrorType.INVALID_REQUEST, param="request_id", code=ErrorCode.REQUEST_ID_REUSED, message=message
    )


def refused(
    request: wire.GenerationRequest, error: wire.ErrorInfo, now_ms: int, request_copy: str = ""
) -> wire.FinalResult:
    """The ``errored`` result of a Kafka-direct request answered at entry, never queued."""
    return wire.FinalResult.for_request(
        request, wire.Outcome.ERRORED, finished_ms=now_ms, error=error, request_copy=request_copy
    )


def replayed(stored: wire.FinalResult, request: wire.GenerationRequest, request_copy: str) -> wire.FinalResult | None:
    """The stored result of an earlier request, as the answer to ``request`` that re-produced its id at
    ``request_copy``; None when it may not be given: another tenant's, or one that did not answer a Kafka reply topic
    (HTTP and batch-job ids are not a Kafka producer's to replay)."""
    if stored.tenant_id != request.tenant_id or not isinstance(stored.reply_to, wire.KafkaReply):
        return None
    return msgspec.structs.replace(stored, reply_to=request.reply_to, request_copy=request_copy)

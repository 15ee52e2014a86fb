"""The FinalResult the batcher sends for a request it answers itself (expired, canceled, overloaded, too large)."""

from __future__ import annotations

from llmq_core import wire
from llmq_batcher.policy import Answer

INVALID_REPLY_TOPIC = "invalid_reply_topic"  # error.code of a request refused for its reply topic


def final_result(answer: Answer, now_ms: int) -> wire.FinalResult:
    """A terminal result for ``answer.request`` stamped at ``now_ms`` (epoch ms); it never reached a worker."""
    request = answer.request
    waited_ms = max(now_ms - request.created_ms, 0)
    return wire.FinalResult(
        request_id=request.request_id,
        outcome=answer.outcome,
        model=request.model,
        tenant_id=request.tenant_id,
        endpoint=request.endpoint,
        reply_to=request.reply_to,
        timings=wire.Timings(queued_ms=waited_ms, total_ms=waited_ms),
        error=wire.ErrorInfo(type=answer.error_type, message=answer.message, code=answer.code,
                             retryable=answer.retryable),
        created_ms=request.created_ms,
        finished_ms=now_ms,
        traffic_class=request.traffic_class,
    )


def refused_reply_topic(request: wire.GenerationRequest, reason: str, now_ms: int) -> wire.FinalResult:
    """The ``errored`` result of a Kafka-direct request whose reply topic may not receive results (see
    :func:`llmq_core.kafka.reply_topic_error`): it is answered at entry, never queued."""
    error = wire.ErrorInfo(type="invalid_request_error", message=reason, code=INVALID_REPLY_TOPIC,
                           param="reply_to.topic")
    return wire.FinalResult(request_id=request.request_id, outcome=wire.Outcome.ERRORED, model=request.model,
                            tenant_id=request.tenant_id, endpoint=request.endpoint, reply_to=request.reply_to,
                            error=error, created_ms=request.created_ms, finished_ms=now_ms,
                            traffic_class=request.traffic_class)

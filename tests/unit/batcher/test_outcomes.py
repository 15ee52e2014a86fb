"""FinalResults the batcher itself sends."""

from llmq_batcher.outcomes import final_result
from llmq_batcher.policy import Answer
from llmq_core import wire
from llmq_core.status import ErrorCode
from tests.unit.batcher.helpers import T0, req


def test_expired_answer_carries_the_requests_identity_and_timings():
    request = req("r1", tenant="acme")
    result = final_result(Answer(request, wire.Outcome.EXPIRED, "expired", "deadline passed"), T0 + 250)
    assert (result.request_id, result.outcome, result.tenant_id, result.model) == (
        "r1",
        wire.Outcome.EXPIRED,
        "acme",
        request.model,
    )
    assert result.reply_to == request.reply_to
    assert (result.timings.total_ms, result.created_ms, result.finished_ms) == (250, T0, T0 + 250)
    assert result.error == wire.ErrorInfo(type="expired", message="deadline passed")
    assert wire.decode(wire.encode(result)) == result


def test_request_too_large_answer_is_an_openai_error_with_its_code():
    answer = Answer(
        req("r1"), wire.Outcome.ERRORED, "invalid_request_error", "too large", code=ErrorCode.REQUEST_TOO_LARGE
    )
    assert final_result(answer, T0).error == wire.ErrorInfo(
        type="invalid_request_error", message="too large", code="request_too_large", retryable=False
    )

"""Result lines sorted by outcome; invalid requests are not retried, the rest are; content is validated."""

import json

import pytest

from llmq_cli.batchrun.outcomes import classify, schema_validator
from tests.unit.batchrun.fakes import ended, failed, ok

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def line(cid, body):
    return {"id": "x", "custom_id": cid, **body}


def test_a_succeeded_line_is_accepted_with_its_tokens_and_kept_as_received():
    attempt = classify(line("a", ok('{"ok": true}')), schema_validator(SCHEMA))
    assert attempt.accepted and (attempt.input_tokens, attempt.output_tokens) == (10, 5)
    assert '"custom_id":"a"' in attempt.line


@pytest.mark.parametrize(
    ("text", "code"), [('{"ok": true}{"ok"', "invalid_json"), ('{"ok": "yes"}', "schema_mismatch")]
)
def test_a_bad_answer_is_a_retryable_failure_still_billed(text, code):
    attempt = classify(line("a", ok(text)), schema_validator(SCHEMA))
    assert (attempt.outcome, attempt.code, attempt.retryable) == ("errored", code, True)
    assert attempt.output_tokens == 5 and not attempt.accepted


def test_without_a_schema_any_answer_is_accepted():
    assert classify(line("a", ok("not json"))).accepted


@pytest.mark.parametrize(
    ("body", "outcome", "code", "retryable"),
    [
        (failed(400, "invalid_value"), "errored", "invalid_value", False),
        (failed(404, "model_not_found"), "errored", "model_not_found", False),
        (failed(500, "engine_error"), "errored", "engine_error", True),
        (failed(429, "rate_limited"), "errored", "rate_limited", True),
        (ended("batch_expired"), "expired", "batch_expired", True),
        (ended("batch_cancelled"), "canceled", "batch_cancelled", True),
    ],
)
def test_failures_are_sorted_by_outcome_and_only_invalid_requests_are_final(body, outcome, code, retryable):
    attempt = classify(line("a", body))
    assert (attempt.outcome, attempt.code, attempt.retryable) == (outcome, code, retryable)


def test_a_broken_schema_is_refused_at_once():
    with pytest.raises(Exception, match="not valid"):
        schema_validator({"type": 12})


def anthropic_line(custom_id: str, result: dict) -> dict:
    return {"custom_id": custom_id, "result": result}


def test_a_message_batch_result_is_sorted_by_its_type():
    message = {"content": [{"type": "text", "text": '{"ok": true}'}], "usage": {"input_tokens": 3, "output_tokens": 4}}
    succeeded = classify(anthropic_line("a", {"type": "succeeded", "message": message}), schema_validator(SCHEMA))
    assert succeeded.accepted and (succeeded.input_tokens, succeeded.output_tokens) == (3, 4)
    assert json.loads(succeeded.line)["result"]["message"] == message
    refused = classify(
        anthropic_line("a", {"type": "succeeded", "message": {"content": [{"text": "no"}]}}), schema_validator(SCHEMA)
    )
    assert (refused.outcome, refused.code, refused.retryable) == ("errored", "invalid_json", True)

    def errored(kind: str):
        return classify(
            anthropic_line(
                "b", {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": "m"}}}
            )
        )

    assert (
        not errored("invalid_request_error").retryable
        and errored("invalid_request_error").code == "invalid_request_error"
    )
    assert errored("api_error").retryable and errored("overloaded_error").retryable
    for kind in ("canceled", "expired"):
        attempt = classify(anthropic_line("c", {"type": kind}))
        assert attempt.outcome == kind and attempt.retryable

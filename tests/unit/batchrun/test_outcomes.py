"""Result lines sorted by outcome; invalid requests are not retried, the rest are; content is validated."""

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

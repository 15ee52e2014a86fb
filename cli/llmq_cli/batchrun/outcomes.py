"""Sorting the lines of a shard's output and error files (or a Message Batch's results) by outcome; content
validation. Pure.

Outcomes are the four of a batch line (succeeded, errored, canceled, expired). A succeeded line whose answer fails
``--json-schema`` becomes ``errored`` (code ``invalid_json`` / ``schema_mismatch``). Retryable: canceled, expired,
server errors (5xx, 408, 429), content failures (a model may answer otherwise next time) and lines the target never
returned; not retryable: other 4xx (an invalid request fails again unchanged).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import jsonschema

SUCCEEDED, ERRORED, CANCELED, EXPIRED = "succeeded", "errored", "canceled", "expired"
OUTCOMES = (SUCCEEDED, ERRORED, CANCELED, EXPIRED)
RETRYABLE_STATUS = frozenset({408, 409, 429})
_ENDED = {"batch_expired": EXPIRED, "batch_cancelled": CANCELED, "batch_canceled": CANCELED}
# Anthropic's error types of the server's own failures (the rest, invalid_request_error, ..., fail again unchanged)
ANTHROPIC_RETRYABLE = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})

Validator = Callable[[str], tuple[str, str] | None]  # answer text -> (code, message) when it is refused


@dataclass(frozen=True, slots=True)
class Attempt:
    """One result line of one shard. ``line`` is the output line as received (kept for an accepted result)."""

    custom_id: str
    outcome: str
    code: str = ""
    message: str = ""
    retryable: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    line: str = ""

    @property
    def accepted(self) -> bool:
        return self.outcome == SUCCEEDED


def classify(line: dict, validate: Validator | None = None) -> Attempt:
    """The attempt a result line (of the output or the error file) records."""
    custom_id = str(line.get("custom_id", ""))
    if isinstance(line.get("result"), dict):
        return _classify_anthropic(custom_id, line, validate)
    response = line.get("response") or None
    error = line.get("error") or None
    if response is None:
        code = str((error or {}).get("code") or "no_response")
        outcome = _ENDED.get(code, ERRORED)
        return Attempt(custom_id, outcome, code, str((error or {}).get("message", "")), retryable=True)
    status = int(response.get("status_code") or 0)
    body = response.get("body") or {}
    usage = body.get("usage") or {} if isinstance(body, dict) else {}
    tokens = dict(
        input_tokens=int(usage.get("prompt_tokens") or 0), output_tokens=int(usage.get("completion_tokens") or 0)
    )
    if status != 200:
        detail = body.get("error") or {} if isinstance(body, dict) else {}
        retryable = status >= 500 or status in RETRYABLE_STATUS or bool(line.get("dead_letter"))
        code = str(detail.get("code") or detail.get("type") or f"http_{status}")
        return Attempt(custom_id, ERRORED, code, str(detail.get("message", "")), retryable, **tokens)
    refused = validate(answer_text(body)) if validate else None
    if refused:
        return Attempt(custom_id, ERRORED, refused[0], refused[1], retryable=True, **tokens)
    return Attempt(custom_id, SUCCEEDED, line=json.dumps(line, ensure_ascii=False, separators=(",", ":")), **tokens)


def _classify_anthropic(custom_id: str, line: dict, validate: Validator | None) -> Attempt:
    """A Message Batch's result line: ``succeeded`` (its message), ``errored`` (Anthropic's error: retryable when it
    is the server's, ANTHROPIC_RETRYABLE), ``canceled`` or ``expired``."""
    result = line["result"]
    kind = result.get("type")
    if kind in (CANCELED, EXPIRED):
        return Attempt(custom_id, kind, kind, f"the request was {kind} with its batch", retryable=True)
    if kind != SUCCEEDED:
        error = ((result.get("error") or {}).get("error") or {}) if isinstance(result.get("error"), dict) else {}
        code = str(error.get("type") or "errored")
        return Attempt(custom_id, ERRORED, code, str(error.get("message", "")), code in ANTHROPIC_RETRYABLE)
    message = result.get("message") or {}
    usage = message.get("usage") or {}
    tokens = dict(input_tokens=int(usage.get("input_tokens") or 0), output_tokens=int(usage.get("output_tokens") or 0))
    blocks = message.get("content") or [{}]
    refused = validate(str(blocks[0].get("text") or "") if isinstance(blocks[0], dict) else "") if validate else None
    if refused:
        return Attempt(custom_id, ERRORED, refused[0], refused[1], retryable=True, **tokens)
    return Attempt(custom_id, SUCCEEDED, line=json.dumps(line, ensure_ascii=False, separators=(",", ":")), **tokens)


def missing(custom_id: str, batch_status: str) -> Attempt:
    """An id its shard's files never mentioned (a target that drops lines, a batch that failed as a whole)."""
    return Attempt(custom_id, ERRORED, "missing_result", f"no result line; the batch ended {batch_status}", True)


def answer_text(body: dict) -> str:
    """The first choice's text: ``message.content`` (chat) or ``text`` (completions)."""
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return str((message.get("content") if isinstance(message, dict) else choice.get("text")) or "")


def schema_validator(schema: dict) -> Validator:
    """A validator that accepts an answer only when it parses as JSON and matches ``schema`` (JSON Schema)."""
    kind = jsonschema.validators.validator_for(schema)
    kind.check_schema(schema)  # a broken schema is the caller's mistake, said before anything runs
    checker = kind(schema)

    def validate(text: str) -> tuple[str, str] | None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return "invalid_json", f"the answer is not JSON: {exc}"
        error = jsonschema.exceptions.best_match(checker.iter_errors(value))
        return ("schema_mismatch", f"the answer does not match the schema: {error.message}") if error else None

    return validate

"""One request's result as a batch API's result line: OpenAI's batch output/error line and Anthropic's Message Batch
result line. The batch jobs' files are made of them, and a Kafka reply that asks for an API's format
(``KafkaReply.body``) is one. Pure.

Sources: OpenAI's batch output file (``{id, custom_id, response: {status_code, request_id, body}, error}``);
Anthropic's Message Batch results (``{custom_id, result: {type: succeeded | errored | canceled | expired, ...}}``).
"""

from __future__ import annotations

from llmq_core import api_formats, wire
from llmq_core.constants import ANTHROPIC
from llmq_core.requests import RequestError
from llmq_core.status import ErrorCode
from llmq_jobs import jobs

_ENDED_CODES = {wire.Outcome.CANCELED: ErrorCode.BATCH_CANCELLED, wire.Outcome.EXPIRED: ErrorCode.BATCH_EXPIRED}
_ENDED_MESSAGES = {
    wire.Outcome.CANCELED: "This request was cancelled with its batch",
    wire.Outcome.EXPIRED: "This request did not run before the batch's completion window ended",
}


def custom_id_of(result: wire.FinalResult) -> str:
    """The id a result line is joined back by: a batch line's ``custom_id``; any other request's own id (a Kafka-direct
    request's: the id its producer gave)."""
    reply = result.reply_to
    return reply.custom_id if isinstance(reply, wire.JobReply) else result.request_id


def line_error(result: wire.FinalResult) -> RequestError:
    """The error of a line that did not succeed, with the status its request would have got over HTTP (an unknown
    model's 404: the stored error keeps only its invalid-request type)."""
    error = api_formats.result_error(result)
    assert error is not None, "a succeeded result has no error"
    if error.code == ErrorCode.MODEL_NOT_FOUND:
        error.status = 404
    return error


def output_line(result: wire.FinalResult) -> tuple[bool, dict]:
    """``(succeeded, line)``: one line of OpenAI's output file (succeeded) or error file (everything else), its
    ``custom_id`` :func:`custom_id_of` the result.

    A request that got an answer carries ``response`` (status code, request id, body: the completion or the
    OpenAI error); a batch line cancelled or expired with its batch carries ``error`` (``batch_cancelled`` /
    ``batch_expired``), any other request's cancel or expiry is its HTTP answer's (409, 504) in ``response``.
    ``dead_letter`` marks a line that still failed with a retryable error after its last retry round.
    """
    line = {
        "id": jobs.output_line_id(result.request_id),
        "custom_id": custom_id_of(result),
        "response": None,
        "error": None,
    }
    outcome = result.outcome
    if outcome is wire.Outcome.SUCCEEDED:
        body = api_formats.response_body(result, result.request_id, result.endpoint, result.created_ms // 1000)
        line["response"] = {"status_code": 200, "request_id": result.request_id, "body": body}
        return True, line
    if outcome in _ENDED_CODES and isinstance(result.reply_to, wire.JobReply):  # ended with its batch
        line["error"] = {"code": _ENDED_CODES[outcome], "message": _ENDED_MESSAGES[outcome]}
        return False, line
    error = line_error(result)
    body = api_formats.error_body(error)
    line["response"] = {"status_code": error.status, "request_id": result.request_id, "body": body}
    if result.error is not None and result.error.retryable:
        line["dead_letter"] = True
    return False, line


def result_line(result: wire.FinalResult) -> dict:
    """One line of a Message Batch's results: ``{custom_id, result}`` (:func:`custom_id_of`); ``result`` is ``succeeded`` with the message,
    ``errored`` with Anthropic's error (an invalid request's ``invalid_request_error``; a line that failed every retry
    round ``api_error``, or the error it last had), ``canceled`` or ``expired``."""
    custom_id, outcome = custom_id_of(result), result.outcome
    if outcome is wire.Outcome.SUCCEEDED:
        message = api_formats.message_body(result, jobs.output_line_id(result.request_id, prefix="msg_"))
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}
    if outcome is wire.Outcome.ERRORED:
        error = line_error(result)
        _, kind = api_formats.anthropic_status(error.status)
        body = api_formats.anthropic_error_body(error, kind, None)
        return {"custom_id": custom_id, "result": {"type": "errored", "error": body}}
    return {"custom_id": custom_id, "result": {"type": outcome.value}}


def reply_line(result: wire.FinalResult) -> dict:
    """A Kafka reply's body in the request's ``api_format`` (``KafkaReply.body`` ``api``): Anthropic's result line,
    or OpenAI's output line."""
    return result_line(result) if result.api_format == ANTHROPIC else output_line(result)[1]

"""A :class:`~llmq_core.wire.FinalResult` as OpenAI's and Anthropic's APIs answer it: the bodies the API pods send,
the batch jobs' result lines carry and the result-router produces to a Kafka reply topic that asks for an API's format
(``KafkaReply.body``). Pure functions of the result; the HTTP edge adds its headers.

Sources: OpenAI's ``chat.completion`` / ``text_completion`` objects and error object; Anthropic's ``Message`` object and
error types (https://docs.anthropic.com/en/api/errors).
"""

from __future__ import annotations

from llmq_core import wire
from llmq_core.constants import INTERACTIVE, TIER_PAID
from llmq_core.logprob_shapes import chat_logprobs, completion_logprobs
from llmq_core.requests import RequestError
from llmq_core.status import ErrorCode, ErrorType

OVERLOADED_STATUS = 529  # Anthropic's status for shed load (its SDK: OverloadedError, retried)

# Anthropic's error type of each status an OpenAI route answers (429 is chosen by its cause: see anthropic_status).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    410: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
}


# --- OpenAI ------------------------------------------------------------------------------------------------------------


def usage_dict(usage: wire.Usage) -> dict:
    """OpenAI's usage: ``prompt_tokens_details.cached_tokens`` counts the prompt tokens found in the prefix cache."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def tool_call_dict(call: wire.ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_message(choice: wire.Choice) -> dict:
    """The assistant message of a chat choice: its text, or the tool calls it made (content null)."""
    if choice.tool_calls:
        return {"role": "assistant", "content": None, "tool_calls": [tool_call_dict(c) for c in choice.tool_calls]}
    return {"role": "assistant", "content": choice.text}


def finish_reason(choice: wire.Choice) -> str | None:
    """OpenAI's finish_reason: ``tool_calls`` for a choice that ended with calls (the wire says ``stop``)."""
    return "tool_calls" if choice.tool_calls and choice.finish_reason == "stop" else choice.finish_reason


def response_body(result: wire.FinalResult, request_id: str, endpoint: wire.Endpoint, created_s: int) -> dict:
    """The non-streaming body of a succeeded result: a ``text_completion`` or a ``chat.completion``."""
    choices = sorted(result.choices, key=lambda c: c.index)
    if endpoint == "chat.completions":
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": created_s,
            "model": result.model,
            "choices": [
                {
                    "index": c.index,
                    "message": chat_message(c),
                    "logprobs": chat_logprobs(c.logprobs),
                    "finish_reason": finish_reason(c),
                }
                for c in choices
            ],
            "usage": usage_dict(result.usage),
            "system_fingerprint": None,
        }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created_s,
        "model": result.model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": completion_logprobs(c.logprobs),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_dict(result.usage),
        "system_fingerprint": None,
    }


def result_error(result: wire.FinalResult) -> RequestError | None:
    """The error (HTTP status, type, code, param, message) a result that did not succeed answers with over HTTP;
    ``None`` for a succeeded one. ``expired`` is a 504 ``deadline_exceeded``, ``canceled`` a 409; an errored result's
    status follows its error: invalid request 400, overloaded 429, retryable 503, else 500."""
    if result.outcome == wire.Outcome.SUCCEEDED:
        return None
    if result.outcome == wire.Outcome.EXPIRED:
        return RequestError(
            504, "The request expired before it completed", type=ErrorType.TIMEOUT, code=ErrorCode.DEADLINE_EXCEEDED
        )
    if result.outcome == wire.Outcome.CANCELED:
        reason = result.error.message if result.error else "canceled"
        return RequestError(
            409, f"The request was canceled: {reason}", type=ErrorType.CANCELED, code="request_canceled"
        )
    error = result.error
    if error is None:
        return RequestError(500, "The request failed", type=ErrorType.SERVER)
    if error.type == ErrorType.INVALID_REQUEST:
        return RequestError(400, error.message, type=error.type, param=error.param, code=error.code)
    if error.type == ErrorType.OVERLOADED:  # the batcher's full queue: the backstop behind the pods' admission
        return RequestError(429, error.message, type=error.type, code=ErrorCode.RATE_LIMIT_EXCEEDED)
    status = 503 if error.retryable else 500
    return RequestError(status, error.message, type=error.type or ErrorType.SERVER, code=error.code)


def error_body(error: RequestError) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}`` (param/code may be None)."""
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


# --- Anthropic ---------------------------------------------------------------------------------------------------------


def service_tier(result: wire.FinalResult) -> str:
    """Anthropic's ``usage.service_tier``: ``batch`` for a batch job's line, ``priority`` for interactive work of a
    paid key (llmq's highest priority class), ``standard`` for everything else."""
    if isinstance(result.reply_to, wire.JobReply):
        return "batch"
    return "priority" if result.traffic_class == INTERACTIVE and result.tier == TIER_PAID else "standard"


def stop_reason(choice: wire.Choice) -> str:
    """``max_tokens`` (the limit or the result cap), ``stop_sequence`` (a stop string ended it), ``end_turn``."""
    if choice.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if choice.stop_sequence is not None else "end_turn"


def anthropic_usage(result: wire.FinalResult) -> dict:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the prefix cache, as Anthropic counts
    them; ``cache_read_input_tokens`` the rest."""
    usage = result.usage
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": result.usage.completion_tokens,
        "service_tier": service_tier(result),
    }


def message_body(result: wire.FinalResult, message_id: str) -> dict:
    """The ``message`` of a succeeded result (its first choice: Anthropic has no ``n``)."""
    choice = min(result.choices, key=lambda c: c.index)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": choice.text}],
        "model": result.model,
        "stop_reason": stop_reason(choice),
        "stop_sequence": choice.stop_sequence,
        "usage": anthropic_usage(result),
    }


def anthropic_status(status: int, tenant_limit: bool = False) -> tuple[int, str]:
    """(status, Anthropic error type) of an OpenAI route's ``status``: a 429 is the tenant's own ``rate_limit_error``
    when ``tenant_limit``, else shed load (529 ``overloaded_error``); a status not in ANTHROPIC_ERROR_TYPES is an
    ``api_error`` when >= 500, an ``invalid_request_error`` below."""
    if status == 429:
        return (429, "rate_limit_error") if tenant_limit else (OVERLOADED_STATUS, "overloaded_error")
    return status, ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_body(error: RequestError, kind: str, request_id: str | None) -> dict:
    """Anthropic's error object ``{type: error, error: {type, message}, request_id}``; the field at fault leads the
    message (Anthropic's errors have no ``param``)."""
    message = f"{error.param}: {error.message}" if error.param else error.message
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}

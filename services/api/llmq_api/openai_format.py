"""OpenAI response shapes built from llmq results, the SSE framing, and the outcome -> HTTP status mapping.

Status mapping of a resolution (see :func:`error_for`):
  succeeded -> 200; errored -> 400 for the worker's ``invalid_request_error``, 429 + Retry-After for the batcher's
  ``overloaded``, 503 + Retry-After when retryable, 500 otherwise; expired (the system's deadline) or the pod's own deadline -> 504; canceled by the system while the
  client still waits -> 409 (``request_canceled``; retrying is safe). A client that left gets nothing (logged as 499).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmq_api.errors import RETRY_AFTER_S, RETRYABLE_STATUSES, ApiError
from llmq_api.logprobs_format import StreamLogprobs
from llmq_api.sse import data_json
from llmq_api.waiters import Abandoned, DeadlineExceeded, Resolution
from llmq_core import status, structured, wire
from llmq_core.api_formats import finish_reason, response_body, result_error, tool_call_dict, usage_dict
from llmq_core.constants import HTTP_RETRY_AFTER
from llmq_core.status import ErrorCode, ErrorType, OutcomeLabel

if TYPE_CHECKING:
    from llmq_api.responses import PendingRequest  # responses imports this module

CLIENT_GONE_STATUS = 499  # recorded in metrics/logs only: nobody is there to receive it

SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    """One Server-Sent Event carrying ``payload`` as JSON."""
    return b"data: " + data_json(payload) + b"\n\n"


class ChunkFormatter:
    """Stream chunks of one request (``text_completion`` or ``chat.completion.chunk``), all with the same id; each
    text chunk carries the logprob entries of its text (``logprobs`` counts what was sent of them)."""

    def __init__(self, request_id: str, endpoint: wire.Endpoint, model: str, created_s: int, include_usage: bool):
        self.chat = endpoint == "chat.completions"
        self.include_usage = include_usage
        self._head = {
            "id": request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": created_s,
            "model": model,
            "system_fingerprint": None,
        }
        self.logprobs = StreamLogprobs(self.chat)

    def _chunk(self, choices: list[dict]) -> bytes:
        payload = {**self._head, "choices": choices}
        if self.include_usage:
            payload["usage"] = None  # OpenAI: null on every chunk but the last one
        return sse(payload)

    def role(self, n: int) -> bytes:
        """Chat's opening chunk: the assistant role for each of ``n`` choices (empty for completions)."""
        if not self.chat:
            return b""
        return self._chunk(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(n)
            ]
        )

    def text(
        self,
        index: int,
        text: str,
        finish_reason: str | None = None,
        logprobs: list[wire.TokenLogprob] | None = None,
    ) -> bytes:
        """New ``text`` of choice ``index`` and the ``logprobs`` entries of its tokens (None: not asked); with
        ``finish_reason`` set it is that choice's last chunk."""
        rendered = self.logprobs.render(index, logprobs)
        if self.chat:
            delta = {"content": text} if text else {}
            choice = {"index": index, "delta": delta, "logprobs": rendered, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text, "logprobs": rendered, "finish_reason": finish_reason}
        return self._chunk([choice])

    def tool_calls(self, choice: wire.Choice) -> bytes:
        """Chat's chunks of a choice that made tool calls: one delta per call (its own ``index``, id, name and the
        whole arguments), then the finish chunk."""
        chunks = [
            self._chunk(
                [
                    {
                        "index": choice.index,
                        "delta": {"tool_calls": [{"index": i, **tool_call_dict(call)}]},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for i, call in enumerate(choice.tool_calls or ())
        ]
        return b"".join(chunks) + self.text(choice.index, "", finish_reason(choice))

    def usage(self, usage: wire.Usage) -> bytes:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        return sse({**self._head, "choices": [], "usage": usage_dict(usage)})


def finish_chunks(fmt: ChunkFormatter, result: wire.FinalResult, sent: dict[int, str]) -> bytes:
    """Per choice: whatever text (and logprob entries) the stream has not carried yet, with the finish reason; then
    the usage if asked."""
    parts = []
    for choice in sorted(result.choices, key=lambda c: c.index):
        if choice.tool_calls and fmt.chat:
            parts.append(fmt.tool_calls(choice))
            continue
        rest = choice.text[len(sent.get(choice.index, "")) :]
        parts.append(fmt.text(choice.index, rest, choice.finish_reason, fmt.logprobs.rest(choice)))
    if fmt.include_usage:
        parts.append(fmt.usage(result.usage))
    return b"".join(parts)


class OpenAIStream:
    """A stream of OpenAI chunks: chat's role chunk first, text chunks, the finish chunks, ``data: [DONE]``.

    A chat with tools it may call (tool_choice auto, required or named) holds its text back: whether an answer is
    calls is known only at its end, so the closing chunks carry its calls as tool-call deltas or its whole text."""

    def __init__(self, pending: PendingRequest) -> None:
        request = pending.request
        self._holds = structured.may_call_tools(request)
        self._n = request.sampling.n
        self._fmt = ChunkFormatter(
            pending.request_id, request.endpoint, request.model, pending.created_s, pending.include_usage
        )

    def opening(self) -> bytes:
        return self._fmt.role(self._n)

    def text(self, index: int, text: str, logprobs: list[wire.TokenLogprob] | None = None) -> bytes:
        return b"" if self._holds else self._fmt.text(index, text, logprobs=logprobs)

    def closing(self, result: wire.FinalResult, sent: dict[int, str]) -> bytes:
        return finish_chunks(self._fmt, result, sent) + SSE_DONE  # held text was never sent: all of it goes now

    def failure(self, error: ApiError) -> bytes:
        return sse(error.body()) + SSE_DONE


class OpenAIDialect:
    """OpenAI's wire format (:class:`llmq_api.responses.Dialect`): the error object as it is, no extra headers."""

    def body(self, result: wire.FinalResult, pending: PendingRequest) -> dict:
        return response_body(result, pending.request_id, pending.request.endpoint, pending.created_s)

    def error(self, error: ApiError, request_id: str | None) -> tuple[int, dict, dict[str, str]]:
        return error.status, error.body(), error.response_headers()

    def headers(self, request_id: str) -> dict[str, str]:
        return {}

    def stream(self, pending: PendingRequest) -> OpenAIStream:
        return OpenAIStream(pending)


OPENAI = OpenAIDialect()


def error_for(resolution: Resolution) -> ApiError | None:
    """The client's error for a resolution; ``None`` for a succeeded result."""
    if isinstance(resolution, DeadlineExceeded):
        return ApiError(
            504,
            "The request did not complete before its deadline",
            type=ErrorType.TIMEOUT,
            code=ErrorCode.DEADLINE_EXCEEDED,
        )
    if isinstance(resolution, Abandoned):
        return ApiError(
            CLIENT_GONE_STATUS,
            f"The request was abandoned: {resolution.reason}",
            type=ErrorType.CANCELED,
            code=resolution.reason,
        )
    error = result_error(resolution)
    if error is None:
        return None
    canceled = error.type == ErrorType.CANCELED  # not the request's fault: retrying it is safe
    retry = {HTTP_RETRY_AFTER: str(RETRY_AFTER_S)} if error.status in RETRYABLE_STATUSES else None
    return ApiError(
        error.status,
        error.message,
        type=error.type,
        param=error.param,
        code=error.code,
        headers=retry,
        retryable=canceled or None,
    )


def outcome_label(resolution: Resolution) -> str:
    """The metrics label of a resolution: the wire outcome, ``deadline`` (the pod's timer) or ``abandoned``."""
    if isinstance(resolution, DeadlineExceeded):
        return OutcomeLabel.DEADLINE
    if isinstance(resolution, Abandoned):
        return OutcomeLabel.ABANDONED
    return status.outcome_label(resolution.outcome)

"""Anthropic's Messages API at the pod's edge: its headers, its error shape and status mapping, its response and its
stream events, built from the same llmq results as OpenAI's (``llmq_api.openai_format``); the request bodies are
``llmq_api.anthropic_messages``'s.

Errors (:func:`anthropic_error`): ``{"type": "error", "error": {"type", "message"}, "request_id"}``, the message
naming the parameter or header at fault. Statuses stay OpenAI's, except that a 429 of shed load (admission control,
a full pod, the batcher's full queue) becomes Anthropic's 529 ``overloaded_error``; a tenant's own limits stay 429
``rate_limit_error``. Both keep their ``retry-after`` and ``x-should-retry`` (Anthropic's SDK obeys it too).
docs/anthropic.md has the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from llmq_api.auth import KeyStore, Principal
from llmq_api.errors import ApiError, invalid
from llmq_api.ratelimit import BATCH_BUCKET, REQUESTS_BUCKET, TOKENS_BUCKET
from llmq_api.sse import data_json
from llmq_core import api_formats, wire
from llmq_core.constants import (
    HTTP_ANTHROPIC_REQUEST_ID,
    HTTP_ANTHROPIC_VERSION,
    HTTP_API_KEY,
)
from llmq_core.requests import echo
from llmq_core.status import ErrorCode

if TYPE_CHECKING:
    from starlette.datastructures import Headers

    from llmq_api.responses import PendingRequest

# What anthropic-version may say: the pinned SDK's (anthropic 2.15 sends 2026-10-21) and Anthropic's documented
# examples' (2023-06-01). The shapes served are the same for both.
ANTHROPIC_VERSIONS = ("2023-06-01", "2026-10-21")
_TENANT_LIMITS = frozenset({REQUESTS_BUCKET, TOKENS_BUCKET, BATCH_BUCKET})  # a 429 of these is the tenant's own


def anthropic_error(error: ApiError, request_id: str | None) -> tuple[int, dict, dict[str, str]]:
    """(status, Anthropic error body, headers) of ``error``: see the module doc and
    :func:`~llmq_core.api_formats.anthropic_status`."""
    status, kind = api_formats.anthropic_status(error.status, tenant_limit=error.type in _TENANT_LIMITS)
    headers = error.response_headers()
    if request_id:
        headers[HTTP_ANTHROPIC_REQUEST_ID] = request_id
    return status, api_formats.anthropic_error_body(error, kind, request_id), headers


def speaks_anthropic(path: str, header_names: Iterable[str | bytes]) -> bool:
    """Whether a request no route claimed yet is an Anthropic caller's: its path is ``/v1/messages...`` or it carries
    ``anthropic-version`` (lower-case names, as ASGI and Starlette give them)."""
    names = {name.decode("latin-1") if isinstance(name, bytes) else name for name in header_names}
    return path.startswith("/v1/messages") or HTTP_ANTHROPIC_VERSION in names


def check_version(headers: Headers) -> None:
    """400 naming ``anthropic-version`` unless it is one of ANTHROPIC_VERSIONS."""
    version = headers.get(HTTP_ANTHROPIC_VERSION)
    if version not in ANTHROPIC_VERSIONS:
        got = f"got {echo(version)}" if version is not None else "it is missing"
        raise invalid(
            f"{HTTP_ANTHROPIC_VERSION} must be one of {', '.join(ANTHROPIC_VERSIONS)}; {got}",
            param=HTTP_ANTHROPIC_VERSION,
            code=ErrorCode.MISSING_REQUIRED_PARAMETER if version is None else ErrorCode.INVALID_VALUE,
        )


def authenticate(keys: KeyStore, headers: Headers) -> Principal:
    """The caller of an Anthropic request: its ``x-api-key`` (or ``Authorization: Bearer``), then its
    ``anthropic-version`` (401, then 400)."""
    api_key = headers.get(HTTP_API_KEY)
    principal = keys.authenticate(f"Bearer {api_key}" if api_key is not None else headers.get("authorization"))
    check_version(headers)
    return principal


def event(name: str, payload: dict) -> bytes:
    """One Server-Sent Event of Anthropic's stream: its ``event:`` name and its JSON ``data:``."""
    return b"event: " + name.encode() + b"\ndata: " + data_json(payload) + b"\n\n"


class AnthropicStream:
    """Anthropic's stream of one text block: ``message_start``, ``content_block_start``, ``ping``, a
    ``content_block_delta`` (``text_delta``) per chunk, then ``content_block_stop``, ``message_delta`` (stop reason,
    output tokens) and ``message_stop``; a failure after the first byte is one ``error`` event. Text arrives from the
    workers in whole characters, and each event is encoded whole, so no character is ever split across events."""

    def __init__(self, pending: PendingRequest) -> None:
        request = pending.request
        self._start = {
            "id": pending.request_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": request.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": request.prompt_tokens, "output_tokens": 0},
        }
        self._request_id = pending.request_id

    def opening(self) -> bytes:
        return (
            event("message_start", {"type": "message_start", "message": self._start})
            + event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
            + event("ping", {"type": "ping"})
        )

    def text(self, index: int, text: str, logprobs: list[wire.TokenLogprob] | None = None) -> bytes:
        if index != 0 or not text:  # Anthropic's API has no logprobs
            return b""
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return event("content_block_delta", delta)

    def closing(self, result: wire.FinalResult, sent: dict[int, str]) -> bytes:
        choice = min(result.choices, key=lambda c: c.index)
        delta = {"stop_reason": api_formats.stop_reason(choice), "stop_sequence": choice.stop_sequence}
        return (
            self.text(0, choice.text[len(sent.get(choice.index, "")) :])
            + event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event(
                "message_delta", {"type": "message_delta", "delta": delta, "usage": api_formats.anthropic_usage(result)}
            )
            + event("message_stop", {"type": "message_stop"})
        )

    def failure(self, error: ApiError) -> bytes:
        _, body, _ = anthropic_error(error, self._request_id)
        return event("error", body)


class AnthropicDialect:
    """Anthropic's wire format (:class:`llmq_api.responses.Dialect`); every response carries ``request-id``."""

    def body(self, result: wire.FinalResult, pending: PendingRequest) -> dict:
        return api_formats.message_body(result, pending.request_id)

    def error(self, error: ApiError, request_id: str | None) -> tuple[int, dict, dict[str, str]]:
        return anthropic_error(error, request_id)

    def headers(self, request_id: str) -> dict[str, str]:
        return {HTTP_ANTHROPIC_REQUEST_ID: request_id}

    def stream(self, pending: PendingRequest) -> AnthropicStream:
        return AnthropicStream(pending)


ANTHROPIC_DIALECT = AnthropicDialect()


def model_info(entry: dict) -> dict:
    """An OpenAI ``/v1/models`` entry (``ModelCatalog.listing``) as Anthropic's ``ModelInfo``."""
    return {
        "type": "model",
        "id": entry["id"],
        "display_name": entry["id"],
        "created_at": "1970-01-01T00:00:00Z",  # llmq does not know when a checkpoint was made (OpenAI's created: 0)
        "lifecycle": "active",
        "max_input_tokens": entry["context_window"],
    }


def model_list(entries: list[dict]) -> dict:
    """Anthropic's model page: every model on one page (``limit``, ``before_id``, ``after_id`` are not applied)."""
    data = [model_info(entry) for entry in entries]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }

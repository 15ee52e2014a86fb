"""Anthropic Messages request bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``) checked into the one
internal request: a :class:`~llmq_api.validation.ValidRequest` of the chat endpoint, ``api_format`` anthropic.

Every top-level key of the pinned SDK's ``MessageCreateParams`` is one of three kinds (docs/anthropic.md lists them):
read (:data:`READ`), accepted and ignored (:data:`IGNORED`: they change nothing llmq does), or refused with a 400
naming it unless absent or off (:data:`REFUSED_UNLESS_OFF`: honouring them silently wrong would be worse). Any other
key is a 400 naming it, as Anthropic's API answers. Pure: no I/O; every mistake is an :class:`ApiError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from llmq_api.errors import invalid
from llmq_api.validation import ValidRequest, client_errors, decode_body, joined_text
from llmq_core import requests, structured, wire
from llmq_core.constants import ANTHROPIC, TIER_FREE
from llmq_core.requests import echo
from llmq_core.token_counts import BYTES, TokenCounter

# temperature, top_p, top_k arrive through the SDK's extra_body (anthropic 2.15 has no such arguments).
READ = frozenset(
    {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "metadata", "service_tier"}
    | {"temperature", "top_p", "top_k", "output_config"}  # output_config: its format (structured outputs) only
)
# cache_control: no prompt cache; container: no code execution; diagnostics: no cache to diagnose; inference_geo: the
# region is the endpoint's; speed: one speed. top_k is read but not applied (no engine takes it yet).
IGNORED = frozenset({"cache_control", "container", "diagnostics", "inference_geo", "speed"})
REFUSED_UNLESS_OFF = frozenset({"tools", "tool_choice", "thinking"})
ROLES = ("user", "assistant")
DEFAULT_TEMPERATURE = 1.0  # Anthropic's default; top_p's is 1.0 (off), as wire.SamplingParams has them


class _Block(msgspec.Struct, kw_only=True):
    """A content block; only ``text`` ones are read (their ``cache_control``, ``citations`` are ignored)."""

    type: str
    text: str | None = None


class _Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: str
    content: str | list[_Block]


class _Thinking(msgspec.Struct, kw_only=True):
    type: str


class _ToolChoice(msgspec.Struct, kw_only=True):
    type: str


class _OutputFormat(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: str
    schema: dict[str, Any] | None = None


class _OutputConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Anthropic's structured outputs: ``format`` ``{"type": "json_schema", "schema"}`` (other keys: a 400)."""

    format: _OutputFormat | None = None


class PromptBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What ``/v1/messages/count_tokens`` takes (the SDK's ``MessageCountTokensParams``)."""

    model: str
    messages: list[_Message]
    system: str | list[_Block] | None = None
    cache_control: Any = None
    output_config: _OutputConfig | None = None
    speed: Any = None
    thinking: _Thinking | None = None
    tool_choice: _ToolChoice | None = None
    tools: list[Any] | None = None


class _Metadata(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    user_id: str | None = None  # accepted; llmq's tenant is the key's


class MessagesBody(PromptBody, kw_only=True, forbid_unknown_fields=True):
    """What ``/v1/messages`` takes (the SDK's ``MessageCreateParams``, plus the sampling keys of ``extra_body``)."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    metadata: _Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None


def parse_messages(
    body: bytes,
    models: Mapping[str, int],
    *,
    max_stop_bytes: int = requests.DEFAULT_MAX_STOP_BYTES,
    counters: Mapping[str, TokenCounter] = {},
    max_schema_bytes: int = structured.DEFAULT_MAX_SCHEMA_BYTES,
) -> ValidRequest:
    """A ``/v1/messages`` body as the one internal request (chat endpoint). ``models``: name -> context window;
    ``max_schema_bytes``: of ``output_config.format``'s schema (Settings.api.max_json_schema_bytes).

    Raises ApiError: 400 (malformed, wrong types, out of range, an unknown or refused key), 404 (unknown model).
    """
    raw = decode_body(body, MessagesBody)
    with client_errors():
        messages, prompt_tokens, window = _prompt(raw, models, counters)
        requests.in_range("temperature", raw.temperature, 0.0, 1.0)  # Anthropic's range (OpenAI's is 0 to 2)
        sampling = wire.SamplingParams(
            max_tokens=raw.max_tokens,
            temperature=DEFAULT_TEMPERATURE if raw.temperature is None else raw.temperature,
            top_p=1.0 if raw.top_p is None else raw.top_p,
            stop=list(raw.stop_sequences or ()),
        )
        requests.check_sampling(sampling, max_stop_bytes=max_stop_bytes, stop_param="stop_sequences")
        requests.check_context(prompt_tokens, raw.max_tokens, window, "messages", True)
        constraint = _output_format(raw.output_config, max_schema_bytes)
    return ValidRequest(
        endpoint="chat.completions",
        model=raw.model,
        messages=messages,
        sampling=sampling,
        stream=bool(raw.stream),
        prompt_tokens=prompt_tokens,
        api_format=ANTHROPIC,
        structured=constraint,
        asked_tier=TIER_FREE if raw.service_tier == "standard_only" else None,
    )


def count_tokens(body: bytes, models: Mapping[str, int], counters: Mapping[str, TokenCounter]) -> int:
    """``input_tokens`` of a ``/v1/messages/count_tokens`` body: the prompt as the model's tokenizer and chat template
    count it (what ``usage.input_tokens`` of the same messages will say). Raises as :func:`parse_messages`."""
    raw = decode_body(body, PromptBody)
    with client_errors():
        return _prompt(raw, models, counters)[1]


def _prompt(
    raw: PromptBody, models: Mapping[str, int], counters: Mapping[str, TokenCounter]
) -> tuple[list[wire.ChatMessage], int, int]:
    """(chat messages with the system prompt first, their tokens, the model's context window)."""
    window = requests.check_model(raw.model, models)
    _refuse_unless_off(raw)
    messages = [_message(i, message) for i, message in enumerate(raw.messages)]
    if not messages:
        raise invalid("'messages' must be a non-empty list", param="messages")
    if messages[-1].role == "assistant":  # Anthropic continues it (prefill); a chat template would close it
        raise invalid(
            "A final assistant message (prefill) is not supported: the last message must be the user's",
            param=f"messages[{len(messages) - 1}].role",
        )
    if raw.system:
        messages.insert(0, wire.ChatMessage(role="system", content=_text(raw.system, "system")))
    return messages, requests.count_prompt(counters.get(raw.model, BYTES), messages=messages), window


def _refuse_unless_off(raw: PromptBody) -> None:
    used = {
        "tools": bool(raw.tools),
        "tool_choice": raw.tool_choice is not None and raw.tool_choice.type != "none",
        "thinking": raw.thinking is not None and raw.thinking.type != "disabled",
    }
    for param, is_used in used.items():
        if is_used:
            raise invalid(f"'{param}' is not supported by this server", param=param, code="unsupported_parameter")


def _output_format(config: _OutputConfig | None, max_schema_bytes: int) -> wire.Structured | None:
    """``output_config.format`` as the wire's constraint: a JSON schema, checked as OpenAI's response_format is."""
    if config is None or config.format is None:
        return None
    if config.format.type != "json_schema":
        raise invalid(
            f"output_config.format.type must be json_schema, got {echo(config.format.type)}",
            param="output_config.format",
        )
    constraint = structured.json_schema_constraint("output", config.format.schema or {})
    requests.check_constraint(constraint, max_schema_bytes, "output_config.format")
    return constraint


def _message(i: int, message: _Message) -> wire.ChatMessage:
    if message.role not in ROLES:
        raise invalid(
            f"Unsupported role {echo(message.role)}; expected one of {', '.join(ROLES)} (the system prompt is the"
            " top-level 'system')",
            param=f"messages[{i}].role",
        )
    return wire.ChatMessage(role=message.role, content=_text(message.content, f"messages[{i}].content"))


def _text(content: str | list[_Block], param: str) -> str:
    """A string, or text blocks joined; any other block is a 400 naming it."""
    if isinstance(content, str):
        return content
    return joined_text(content, lambda j: f"{param}[{j}].type", "content blocks")

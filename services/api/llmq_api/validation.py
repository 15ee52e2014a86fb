"""Pure validation of OpenAI request bodies and llmq headers; every client mistake becomes an :class:`ApiError` (4xx).

Nothing here does I/O: the app passes in the raw body, header values, the known models (name -> context window in
tokens, 0 when unknown) and their token counters (model -> its tokenizer; others count bytes), and gets back a :class:`ValidRequest` ready to become a ``wire.GenerationRequest``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from llmq_api import unsupported
from llmq_api.errors import ApiError, invalid
from llmq_core import requests, structured, wire
from llmq_core.constants import (
    HTTP_SDK_READ_TIMEOUT,
    HTTP_TIMEOUT_MS,
    HTTP_TRAFFIC_CLASS,
    INTERACTIVE,
    JSON_OBJECT,
    JSON_SCHEMA,
    MAX_COMPLETION_LOGPROBS,
    MAX_RESULT_BYTES,
    MAX_TOP_LOGPROBS,
    OPENAI,
    TOOL_CHOICE_AUTO,
    TOOL_CHOICE_FUNCTION,
    TOOL_CHOICE_NONE,
    TOOL_CHOICE_REQUIRED,
    TRAFFIC_CLASSES,
)
from llmq_core.requests import DEFAULT_MAX_STOP_BYTES, INT64_MAX, RequestError, echo
from llmq_core.status import ErrorCode
from llmq_core.token_counts import BYTES, TokenCounter

if TYPE_CHECKING:
    from llmq_api.auth import Principal  # auth imports this module

DEFAULT_MAX_TOKENS = wire.SamplingParams().max_tokens  # OpenAI's legacy completions default (16); chat has none
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes digits int() refuses, such as '²'


class ValidRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A request that passed validation. Exactly one of ``prompt`` / ``messages`` is set; ``prompt_tokens`` counts the
    prompt (chat: rendered with the model's chat template) with the model's own tokenizer."""

    endpoint: wire.Endpoint
    model: str
    prompt: str | None = None
    messages: list[wire.ChatMessage] | None = None
    sampling: wire.SamplingParams
    stream: bool = False
    include_usage: bool = False
    prompt_tokens: int
    api_format: str = OPENAI  # the caller's wire format (constants.OPENAI, constants.ANTHROPIC)
    structured: wire.Structured | None = None  # response_format json_object / json_schema, or a forced tool_choice
    tools: list[wire.Tool] | None = None
    tool_choice: str = ""
    asked_tier: wire.Tier | None = None  # a tier below its key's the caller asked for (Anthropic's standard_only): free

    def to_wire(self, principal: Principal, traffic_class: str, **fields) -> wire.GenerationRequest:
        """This request as ``principal`` (its tenant and tier) sends it in ``traffic_class``; ``fields``: the rest
        (request_id, created_ms, deadline_ms, reply_to, ...)."""
        copied = {name: getattr(self, name) for name in WIRE_FIELDS}
        return wire.GenerationRequest(
            tenant_id=principal.tenant_id, tier=principal.tier, traffic_class=traffic_class, **copied, **fields
        )


# What a GenerationRequest takes of a ValidRequest, field by field under the same name.
WIRE_FIELDS = (
    "model",
    "endpoint",
    "prompt",
    "messages",
    "sampling",
    "stream",
    "prompt_tokens",
    "api_format",
    "structured",
    "tools",
    "tool_choice",
)


# --- request bodies (unknown fields are ignored, as OpenAI-compatible servers do) -------------------------------------


class _StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class _CommonBody(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None


class _CompletionBody(_CommonBody, kw_only=True):
    prompt: str | list[Any] | None = None
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class _ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class _CalledFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: _CalledFunction


class _Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[_ContentPart] | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # the call a tool turn answers


class _JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class _ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: _JsonSchemaFormat | None = None


class _Function(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _ToolDef(msgspec.Struct, kw_only=True):
    type: str
    function: _Function


class _FunctionName(msgspec.Struct, kw_only=True):
    name: str


class _NamedChoice(msgspec.Struct, kw_only=True):
    type: str
    function: _FunctionName


class _ChatBody(_CommonBody, kw_only=True):
    messages: list[_Message] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[_ToolDef] | None = None
    tool_choice: str | _NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    response_format: _ResponseFormat | None = None
    audio: Any = None  # audio output: refused (see llmq_api.unsupported)
    modalities: list[str] | None = None  # only ["text"]


# --- headers ----------------------------------------------------------------------------------------------------------


def check_content_type(content_type: str | None) -> None:
    """Accept ``application/json`` (parameters such as ``charset`` allowed); raise 415 otherwise, also when missing."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            415,
            f"Content-Type must be application/json, got {echo(content_type or 'none')}",
            param="content-type",
            code="unsupported_media_type",
        )


def bounded_int(text: str, cap: int) -> int | None:
    """The non-negative integer ``text`` spells in ASCII digits, or ``cap`` when it is larger; None when ``text`` is
    anything else. Digits past what ``cap`` needs are never converted: ``int()`` refuses text over 4,300 digits
    (a ValueError, which would be a 500)."""
    if not _DIGITS.fullmatch(text):
        return None
    digits = text.lstrip("0")
    return cap if len(digits) > len(str(cap)) else min(int(digits or "0"), cap)


def check_declared_length(content_length: str | None, limit_bytes: int) -> None:
    """Raise 413 when the ``content-length`` header exceeds ``limit_bytes`` (the body is then never read)."""
    declared = bounded_int(content_length.strip(), limit_bytes + 1) if content_length is not None else None
    if declared is not None and declared > limit_bytes:
        raise too_large(limit_bytes)


def too_large(limit_bytes: int) -> ApiError:
    """The 413 for a body over ``limit_bytes``."""
    return ApiError(
        413, f"Request body is larger than the limit of {limit_bytes} bytes", code=ErrorCode.REQUEST_TOO_LARGE
    )


def parse_timeout_ms(value: str | None, default_ms: int, max_ms: int) -> int:
    """The request's timeout in ms from the ``x-llmq-timeout-ms`` header: ``default_ms`` when absent, clamped to
    ``max_ms``; 400 when it is not a positive integer of at most 64 bits."""
    if value is None:
        return min(default_ms, max_ms)
    timeout_ms = bounded_int(value.strip().removeprefix("+"), INT64_MAX + 1)
    if timeout_ms is None or not 0 < timeout_ms <= INT64_MAX:
        raise invalid(
            f"{HTTP_TIMEOUT_MS} must be a positive integer number of milliseconds (at most {INT64_MAX}), "
            f"got {echo(value)}",
            param=HTTP_TIMEOUT_MS,
            code=ErrorCode.INVALID_VALUE,
        )
    return min(timeout_ms, max_ms)


_SECONDS = re.compile(r"(?P<whole>[0-9]+)(?:\.(?P<fraction>[0-9]+))?")


def parse_sdk_read_timeout_ms(value: str | None, max_ms: int) -> int | None:
    """The SDK's read timeout in ms from ``x-stainless-read-timeout`` (decimal seconds, as openai-python sends
    ``str(timeout.read)``), clamped to ``max_ms``; None when absent; 400 when it is not a positive decimal number."""
    if value is None:
        return None
    match = _SECONDS.fullmatch(value.strip())
    whole = bounded_int(match.group("whole"), max_ms // 1000 + 1) if match else None
    timeout_ms = 0 if whole is None else whole * 1000 + int((match.group("fraction") or "").ljust(3, "0")[:3])
    if timeout_ms <= 0:
        raise invalid(
            f"{HTTP_SDK_READ_TIMEOUT} must be a positive number of seconds (e.g. 120.0), got {echo(value)}",
            param=HTTP_SDK_READ_TIMEOUT,
            code=ErrorCode.INVALID_VALUE,
        )
    return min(timeout_ms, max_ms)


def parse_traffic_class(value: str | None) -> str:
    """The traffic class from the ``x-llmq-class`` header (default interactive); 400 for an unknown class."""
    if value is None:
        return INTERACTIVE
    traffic_class = value.strip().lower()
    if traffic_class not in TRAFFIC_CLASSES:
        raise invalid(
            f"{HTTP_TRAFFIC_CLASS} must be one of {', '.join(TRAFFIC_CLASSES)}, got {echo(value)}",
            param=HTTP_TRAFFIC_CLASS,
            code=ErrorCode.INVALID_VALUE,
        )
    return traffic_class


# --- bodies ----------------------------------------------------------------------------------------------------------


def parse(
    endpoint: wire.Endpoint,
    body: bytes,
    models: Mapping[str, int],
    *,
    max_stop_bytes: int = DEFAULT_MAX_STOP_BYTES,
    counters: Mapping[str, TokenCounter] = {},
    max_schema_bytes: int = structured.DEFAULT_MAX_SCHEMA_BYTES,
) -> ValidRequest:
    """Validate a body of ``endpoint`` (``/v1/completions``: :func:`parse_completion`, ``/v1/chat/completions``:
    :func:`parse_chat`). ``models`` maps served model names to context windows (0: unknown); ``max_stop_bytes``: UTF-8
    bytes of one stop sequence, at most (Settings.api.max_stop_bytes); ``max_schema_bytes``: of a response_format's
    JSON schema or of the tools' (Settings.api.max_json_schema_bytes).

    Raises :class:`ApiError`: 400 (malformed, wrong types, out of range, unsupported), 404 (unknown model).
    """
    chat = endpoint == "chat.completions"
    raw = decode_body(body, _ChatBody if chat else _CompletionBody)
    with client_errors():
        context_window = requests.check_model(raw.model, models)
        counter = counters.get(raw.model, BYTES)
        sampling, prompt_tokens, text = (_chat if chat else _completion)(raw, context_window, max_stop_bytes, counter)
        if chat:
            text.update(_constraint(raw, max_schema_bytes))
    return _valid(raw, endpoint, sampling, prompt_tokens, **text)


parse_completion = functools.partial(parse, "completions")
parse_chat = functools.partial(parse, "chat.completions")
_Checked = tuple[wire.SamplingParams, int, dict[str, Any]]  # sampling, prompt tokens, the prompt or the messages


def _completion(raw: _CompletionBody, context_window: int, max_stop_bytes: int, counter: TokenCounter) -> _Checked:
    _reject_unsupported(
        raw,
        echo=bool(raw.echo),
        best_of=raw.best_of not in (None, 1),
        suffix=bool(raw.suffix),
    )
    prompt = _single_prompt(raw.prompt)
    requests.in_range("logprobs", raw.logprobs, 0, MAX_COMPLETION_LOGPROBS)
    sampling = _sampling(raw, raw.max_tokens, max_stop_bytes=max_stop_bytes, logprobs=raw.logprobs)
    prompt_tokens = requests.count_prompt(counter, prompt=prompt)
    requests.check_context(prompt_tokens, sampling.max_tokens, context_window, "prompt", raw.max_tokens is not None)
    return sampling, prompt_tokens, {"prompt": prompt}


def _chat(raw: _ChatBody, context_window: int, max_stop_bytes: int, counter: TokenCounter) -> _Checked:
    """``max_completion_tokens`` wins over ``max_tokens``. Without either (absent or null) the completion is bounded
    only by the context window and the result cap (OpenAI's chat contract): see :func:`chat_max_tokens`."""
    _reject_unsupported(
        raw,
        functions=bool(raw.functions),
        audio=raw.audio is not None,
        modalities=raw.modalities not in (None, ["text"]),
    )
    messages = _chat_messages(raw.messages)
    max_param = "max_completion_tokens" if raw.max_completion_tokens is not None else "max_tokens"
    max_tokens = raw.max_completion_tokens if raw.max_completion_tokens is not None else raw.max_tokens
    sampling = _sampling(raw, max_tokens, max_param, max_stop_bytes=max_stop_bytes, logprobs=_chat_logprobs(raw))
    prompt_tokens = requests.count_prompt(counter, messages=messages)
    if max_tokens is None:
        sampling = msgspec.structs.replace(
            sampling, max_tokens=chat_max_tokens(prompt_tokens, context_window, sampling.n)
        )
    requests.check_context(
        prompt_tokens, sampling.max_tokens, context_window, "messages", max_tokens is not None, max_param
    )
    return sampling, prompt_tokens, {"messages": messages}


def _chat_logprobs(raw: _ChatBody) -> int | None:
    """Chat's ``logprobs`` (bool) and ``top_logprobs`` (0..MAX_TOP_LOGPROBS, only with ``logprobs: true``, as OpenAI
    requires) as SamplingParams.logprobs: None when off, else the alternatives per token."""
    requests.in_range("top_logprobs", raw.top_logprobs, 0, MAX_TOP_LOGPROBS)
    if not raw.logprobs:
        if raw.top_logprobs is not None:
            raise invalid(
                "'top_logprobs' requires 'logprobs' to be true", param="top_logprobs", code=ErrorCode.INVALID_VALUE
            )
        return None
    return raw.top_logprobs or 0


_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RESPONSE_FORMATS = ("text", JSON_OBJECT, JSON_SCHEMA)


def _constraint(raw: _ChatBody, max_schema_bytes: int) -> dict[str, Any]:
    """The ``structured``, ``tools`` and ``tool_choice`` of a chat body: a ``required`` or named tool_choice constrains
    the answer to calls of the tools (it wins over a response_format); otherwise a JSON response_format does."""
    tools = _tools(raw.tools, max_schema_bytes)
    choice, only = _tool_choice(raw.tool_choice, tools)
    constraint = None
    if choice in (TOOL_CHOICE_REQUIRED, TOOL_CHOICE_FUNCTION):
        constraint = structured.tool_constraint(tools, only, raw.parallel_tool_calls is not False)
        requests.check_constraint(constraint, max_schema_bytes * 2, "tools")  # the tools' own size was checked
    elif raw.response_format is not None:
        constraint = _response_format(raw.response_format, max_schema_bytes)
    return {"structured": constraint, "tools": tools or None, "tool_choice": choice}


def _response_format(response_format: _ResponseFormat, max_schema_bytes: int) -> wire.Structured | None:
    kind = response_format.type
    if kind not in _RESPONSE_FORMATS:
        raise invalid(
            f"'response_format.type' must be one of {', '.join(_RESPONSE_FORMATS)}, got {echo(kind)}",
            param="response_format",
        )
    if kind == "text":
        return None
    if kind == JSON_OBJECT:
        return wire.Structured(kind=JSON_OBJECT)
    spec = response_format.json_schema
    if spec is None:
        raise invalid(
            "'response_format.json_schema' is required for type json_schema",
            param="response_format",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    constraint = structured.json_schema_constraint(spec.name, spec.schema if spec.schema is not None else {})
    requests.check_constraint(constraint, max_schema_bytes, "response_format")
    return constraint


def _tools(tools: list[_ToolDef] | None, max_schema_bytes: int) -> list[wire.Tool]:
    checked = []
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise invalid(f"Only function tools are supported, got {echo(tool.type)}", param=f"tools[{i}].type")
        function = tool.function
        if not _FUNCTION_NAME.fullmatch(function.name):
            raise invalid(
                "A function name must be 1 to 64 letters, digits, underscores or dashes",
                param=f"tools[{i}].function.name",
            )
        parameters = structured.compact(function.parameters) if function.parameters is not None else ""
        checked.append(wire.Tool(name=function.name, description=function.description or "", parameters=parameters))
    if len({t.name for t in checked}) != len(checked):
        raise invalid("Function names must be unique", param="tools")
    size = sum(len(t.parameters.encode()) for t in checked)
    if size > max_schema_bytes:
        raise invalid(
            f"the tools' parameters schemas are {size} bytes; at most {max_schema_bytes} are allowed",
            param="tools",
            code="schema_too_large",
        )
    for i, tool in enumerate(checked):
        if tool.parameters:
            constraint = wire.Structured(kind=JSON_SCHEMA, schema=tool.parameters)
            requests.check_constraint(constraint, max_schema_bytes, f"tools[{i}].function.parameters")
    return checked


def _tool_choice(choice: str | _NamedChoice | None, tools: list[wire.Tool]) -> tuple[str, str]:
    """(constants.TOOL_CHOICES value, the named function or ""); "" without tools (OpenAI's default: auto)."""
    if choice is None:
        return (TOOL_CHOICE_AUTO if tools else ""), ""
    if not tools:
        raise invalid("'tool_choice' is only allowed when 'tools' are given", param="tool_choice")
    if isinstance(choice, str):
        if choice not in (TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED):
            raise invalid(
                f"'tool_choice' must be none, auto, required or a named function, got {echo(choice)}",
                param="tool_choice",
            )
        return choice, ""
    if choice.type != "function" or choice.function.name not in {t.name for t in tools}:
        raise invalid(f"'tool_choice' names no function of 'tools': {echo(choice.function.name)}", param="tool_choice")
    return TOOL_CHOICE_FUNCTION, choice.function.name


def _valid(
    raw: _CommonBody, endpoint: wire.Endpoint, sampling: wire.SamplingParams, prompt_tokens: int, **text: Any
) -> ValidRequest:
    """The request a checked body asks for; ``text`` is its ``prompt`` or its ``messages``."""
    return ValidRequest(
        endpoint=endpoint,
        model=raw.model,
        sampling=sampling,
        stream=bool(raw.stream),
        include_usage=_include_usage(raw),
        prompt_tokens=prompt_tokens,
        **text,
    )


@contextmanager
def client_errors() -> Iterator[None]:
    """The shared checks (``llmq_core.requests``) raise RequestError: answer it as the same OpenAI error object."""
    try:
        yield
    except ApiError:
        raise
    except RequestError as exc:
        raise ApiError(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code) from None


def chat_max_tokens(prompt_tokens: int, context_window: int, n: int) -> int:
    """A chat request's limit when it sets none: the room the prompt leaves in the context window (0: unknown, no
    bound), and no more than the result cap allows (every token is at least one byte: ``MAX_RESULT_BYTES // n``).
    At least 1, so a prompt that fills the window is refused as too long."""
    cap = MAX_RESULT_BYTES // n
    return max(1, min(cap, context_window - prompt_tokens)) if context_window > 0 else cap


_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"Object (?:missing required|contains unknown) field `(?P<field>[^`]+)`")


def decode_body(body: bytes, kind: type) -> Any:
    if not body.strip():
        raise invalid("Request body is empty; expected a JSON object", code="invalid_json")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise _type_error(str(exc)) from None
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: arrays or objects nested too deeply
        raise invalid(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def _type_error(text: str) -> ApiError:
    """Turn msgspec's message into a 400 naming the field, e.g. ``messages[0].role`` (a missing one, or an unknown one
    of a body that refuses them)."""
    match = _PATH.search(text)
    path = match.group("path").replace("[...]", "") if match else ""  # a mapping's value: the mapping names it
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
    if not path and text.startswith("Expected `object`"):
        return invalid("Request body must be a JSON object", code="invalid_json")
    return invalid(
        f"Invalid request: {_PATH.sub('', text)}" + (f" (at '{path}')" if path else ""),
        param=path or None,
        code="invalid_type",
    )


def _reject_unsupported(raw: _CommonBody, **used: bool) -> None:
    for param, is_used in used.items():
        if is_used:
            raise invalid(f"'{param}' is not supported by this server", param=param, code="unsupported_parameter")
    for param in ("presence_penalty", "frequency_penalty"):
        if getattr(raw, param) not in (None, 0):
            raise invalid(
                f"'{param}' is not supported by this server (only 0)", param=param, code="unsupported_parameter"
            )


def _single_prompt(prompt: str | list[Any] | None) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise invalid(
                "'prompt' must be a string or a list of exactly one string (token arrays and batched "
                "prompts are not supported)",
                param="prompt",
                code=ErrorCode.INVALID_VALUE,
            )
        prompt = prompt[0]
    return requests.check_prompt(prompt)


def _chat_messages(messages: list[_Message] | None) -> list[wire.ChatMessage]:
    return requests.check_messages([_chat_message(i, message) for i, message in enumerate(messages or ())] or None)


def _chat_message(i: int, message: _Message) -> wire.ChatMessage:
    requests.check_role(i, message.role)
    content = message.content
    if isinstance(content, list):
        content = joined_text(content, lambda j: f"messages[{i}].content[{j}]")
    calls = None
    if message.tool_calls and message.role == "assistant":
        calls = [
            wire.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in message.tool_calls
        ]
        content = content or ""  # an assistant turn that only called tools has null content
    if content is None:
        raise invalid(
            "Message content is required",
            param=f"messages[{i}].content",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    return wire.ChatMessage(role=message.role, content=content, tool_calls=calls, tool_call_id=message.tool_call_id)


def joined_text(parts: list, param_of: Callable[[int], str], noun: str = "content parts") -> str:
    """The text of ``parts`` (each with ``type`` and ``text``: OpenAI's content parts, Anthropic's text blocks)
    joined; a 400 naming ``param_of(j)`` for the first part that is no text."""
    for j, part in enumerate(parts):
        if part.type != "text" or part.text is None:
            raise invalid(
                f"Only text {noun} are supported (images, audio and files are not: see {unsupported.DOCS}), "
                f"got {echo(part.type)}",
                param=param_of(j),
                code=ErrorCode.INVALID_VALUE,
            )
    return "".join(part.text for part in parts)


def _sampling(
    raw: _CommonBody,
    max_tokens: int | None,
    max_param: str = "max_tokens",
    *,
    max_stop_bytes: int,
    logprobs: int | None = None,
) -> wire.SamplingParams:
    defaults = wire.SamplingParams()
    sampling = wire.SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        temperature=raw.temperature if raw.temperature is not None else defaults.temperature,
        top_p=raw.top_p if raw.top_p is not None else defaults.top_p,
        stop=[raw.stop] if isinstance(raw.stop, str) else list(raw.stop or []),
        seed=raw.seed,
        n=raw.n if raw.n is not None else defaults.n,
        logit_bias=_logit_bias(raw.logit_bias),
        logprobs=logprobs,
    )
    requests.check_sampling(
        sampling, max_stop_bytes=max_stop_bytes, max_param=max_param, max_tokens_given=max_tokens is not None
    )
    return sampling


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` keys are token ids spelled as decimal strings; the values are checked with the rest."""
    if not bias:
        return None
    requests.check_logit_bias_size(len(bias))
    checked = {}
    for token, value in bias.items():
        token_id = bounded_int(token, INT64_MAX + 1)
        if token_id is None or token_id > INT64_MAX:
            raise requests.bad_token_id(token)
        checked[token_id] = float(value)
    return checked


def _include_usage(raw: _CommonBody) -> bool:
    if raw.stream_options is None:
        return False
    if not raw.stream:
        raise invalid(
            "'stream_options' is only allowed when 'stream' is true",
            param="stream_options",
            code=ErrorCode.INVALID_VALUE,
        )
    return bool(raw.stream_options.include_usage)

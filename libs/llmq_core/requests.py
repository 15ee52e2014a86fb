"""The checks of a generation request's content, shared by every entry: the API pod (over HTTP and batch-job lines)
and the batcher (Kafka-direct requests), so the two can never disagree.

Pure: a fault raises :class:`RequestError`, carrying the OpenAI error object (message, type, param, code) the API
answers with its ``status`` and the batcher puts into an ``errored`` result. Parsing OpenAI bodies stays in the API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from llmq_core import structured, wire
from llmq_core.constants import (
    ANTHROPIC,
    API_FORMATS,
    DEFERRED,
    INTERACTIVE,
    MAX_LOGIT_BIAS_TOKENS,
    MAX_RESULT_BYTES,
    MAX_TOP_LOGPROBS,
    NEAR_INTERACTIVE,
    REPLY_BODIES,
    TOOL,
    TOOL_CHOICES,
)
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import ApiSettings, JobsSettings, Settings
from llmq_core.status import ErrorCode, ErrorType
from llmq_core.token_counts import BYTES, TokenCounter, load_counters

MAX_N = 128
MAX_STOP_SEQUENCES = 4
DEFAULT_MAX_STOP_BYTES = ApiSettings.model_fields["max_stop_bytes"].default
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ECHOED_CHARS = 40  # of a bad value quoted back in an error message
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def echo(value: object, *, quote: bool = True) -> str:
    """How an error (its message or ``param``) quotes a client's ``value``: the first ECHOED_CHARS characters, then
    ``...`` when there were more, so no answer grows with its input; every quote of a client value goes through
    here. Text is quoted (its repr; ``quote=False``: bare, inside a param path), a number spelled as one (an int of
    more than ECHOED_CHARS digits in hex: Python refuses str() of one above 4,300 digits), anything else as its
    repr."""
    if isinstance(value, str):
        text = value[:ECHOED_CHARS]
        return (repr(text) if quote else text) + ("..." if len(value) > ECHOED_CHARS else "")
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value) if abs(value) < 10**ECHOED_CHARS else f"{value:#x}"
    else:
        text = repr(value)
    return text[:ECHOED_CHARS] + ("..." if len(text) > ECHOED_CHARS else "")


class RequestError(Exception):
    """A client mistake in a request: ``status`` is the HTTP status the API answers it with."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = ErrorType.INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def error_info(self) -> wire.ErrorInfo:
        """The same error object as a result's error (never retryable: the same request fails the same way)."""
        return wire.ErrorInfo(type=self.type, message=self.message, code=self.code, param=self.param)


def invalid(message: str, param: str | None = None, code: str = ErrorCode.INVALID_VALUE) -> RequestError:
    """A 400 ``invalid_request_error`` (``invalid_value`` unless a closer code says more)."""
    return RequestError(400, message, param=param, code=code)


def timeouts_by_class(settings: Settings) -> dict[str, tuple[int, int]]:
    """Traffic class -> (default, maximum) request timeout in ms, from the settings."""
    return {
        INTERACTIVE: (settings.api.interactive_default_timeout_ms, settings.api.interactive_max_timeout_ms),
        NEAR_INTERACTIVE: (
            settings.api.near_interactive_default_timeout_ms,
            settings.api.near_interactive_max_timeout_ms,
        ),
        DEFERRED: (settings.api.deferred_default_timeout_ms, settings.api.deferred_max_timeout_ms),
    }


@dataclass(frozen=True, slots=True)
class Rules:
    """What a request produced straight to Kafka is checked against: ``windows`` maps the catalogue's models to their
    context windows (0: unknown), ``max_timeout_ms`` each traffic class to its longest deadline."""

    windows: Mapping[str, int] = field(
        default_factory=lambda: {m.name: m.context_window for m in BUILTIN_MODELS.values()}
    )
    max_stop_bytes: int = DEFAULT_MAX_STOP_BYTES
    max_schema_bytes: int = structured.DEFAULT_MAX_SCHEMA_BYTES
    max_timeout_ms: Mapping[str, int] = field(
        default_factory=lambda: {cls: bounds[1] for cls, bounds in timeouts_by_class(Settings.defaults()).items()}
    )
    max_job_timeout_ms: int = JobsSettings.model_fields["batch_max_window_s"].default * 1000  # a batch-job line's
    counters: Mapping[str, TokenCounter] = field(default_factory=dict)  # model -> its tokenizer (others: bytes)

    @classmethod
    def from_settings(cls, settings: Settings) -> Rules:
        windows = dict.fromkeys(settings.models.extra, 0)
        windows.update({m.name: m.context_window for m in BUILTIN_MODELS.values()})
        return cls(
            windows=windows,
            max_stop_bytes=settings.api.max_stop_bytes,
            max_schema_bytes=settings.api.max_json_schema_bytes,
            max_timeout_ms={cls_: bounds[1] for cls_, bounds in timeouts_by_class(settings).items()},
            max_job_timeout_ms=settings.jobs.batch_max_window_s * 1000,
            counters=load_counters(settings),
        )

    def max_timeout_of(self, request: wire.GenerationRequest) -> int | None:
        """The longest a request may live: a batch-job line's window at most, else its class's maximum (None: none)."""
        if isinstance(request.reply_to, wire.JobReply):
            return self.max_job_timeout_ms
        return self.max_timeout_ms.get(request.traffic_class)


def check_request(request: wire.GenerationRequest, rules: Rules) -> None:
    """Check a request that did not pass an API pod, as the API checks a body; raises :class:`RequestError`."""
    if request.continuation is not None:
        raise invalid(
            "continuation is set only by llmq's batchers, when they re-dispatch a request whose worker was lost;"
            " a producer may not send one",
            "continuation",
        )
    window = check_model(request.model, rules.windows)
    chat = request.endpoint == "chat.completions"
    check_formats(request, chat)
    counter = rules.counters.get(request.model, BYTES)
    if chat:
        tokens = count_prompt(counter, messages=check_messages(request.messages))
    else:
        tokens = count_prompt(counter, prompt=check_prompt(request.prompt))
    sampling = request.sampling
    check_sampling(sampling, max_stop_bytes=rules.max_stop_bytes)
    check_structured(request, rules.max_schema_bytes)
    check_context(tokens, sampling.max_tokens, window, "messages" if chat else "prompt", True)


def check_formats(request: wire.GenerationRequest, chat: bool) -> None:
    """The request's ``api_format`` is one llmq speaks (Anthropic's: chat only, as its Messages API) and its Kafka
    reply's ``body`` one it writes."""
    if request.api_format not in API_FORMATS:
        raise invalid(
            f"api_format must be one of {', '.join(API_FORMATS)}, got {echo(request.api_format)}", param="api_format"
        )
    if request.api_format == ANTHROPIC and not chat:
        raise invalid("api_format anthropic needs the chat.completions endpoint (Messages are chats)", param="endpoint")
    reply = request.reply_to
    if isinstance(reply, wire.KafkaReply) and reply.body not in REPLY_BODIES:
        raise invalid(
            f"reply_to.body must be one of {', '.join(REPLY_BODIES)}, got {echo(reply.body)}", param="reply_to.body"
        )


def count_prompt(counter: TokenCounter, *, prompt: str = "", messages: list[wire.ChatMessage] | None = None) -> int:
    """Prompt tokens with the model's own counter (chat: ``messages``); a chat its template refuses is a 400."""
    if messages is None:
        return counter.prompt(prompt)
    try:
        return counter.chat(messages)
    except ValueError as exc:
        raise invalid(str(exc), param="messages") from None


def fingerprint(request: wire.GenerationRequest) -> str:
    """Hex digest of what shapes a request's result (model, endpoint, input, sampling): a re-produced request_id is a
    true repeat only when this matches (ids, times, reply target and tenant are the record's, not its parameters)."""
    shape: tuple = (request.model, request.endpoint, request.prompt, request.messages, request.sampling)
    if request.structured is not None or request.tools is not None:  # requests without them keep their old digest
        shape += (request.structured, request.tools, request.tool_choice)
    return hashlib.sha256(msgspec.msgpack.encode(shape)).hexdigest()


def clamp_deadline(request: wire.GenerationRequest, max_timeout_ms: int, now_ms: int) -> wire.GenerationRequest:
    """``request`` with its deadline at most ``max_timeout_ms`` after it was created (or after ``now_ms`` when its
    ``created_ms`` lies ahead): a producer cannot make a request outlive its class's maximum."""
    latest_ms = min(request.created_ms, now_ms) + max_timeout_ms
    if request.deadline_ms <= latest_ms:
        return request
    return msgspec.structs.replace(request, deadline_ms=latest_ms)


def check_model(model: str, windows: Mapping[str, int]) -> int:
    """The model's context window (0: unknown); 404 ``model_not_found`` outside the catalogue."""
    if model not in windows:
        raise RequestError(
            404, f"The model {echo(model)} does not exist", param="model", code=ErrorCode.MODEL_NOT_FOUND
        )
    return windows[model]


def check_prompt(prompt: str | None) -> str:
    if prompt is None:
        raise invalid("'prompt' is required", param="prompt", code=ErrorCode.MISSING_REQUIRED_PARAMETER)
    if not prompt:
        raise invalid("'prompt' must not be empty", param="prompt")
    return prompt


def check_messages(messages: list[wire.ChatMessage] | None) -> list[wire.ChatMessage]:
    if not messages:
        raise invalid("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        check_role(i, message.role)
        if message.role == "tool" and not message.tool_call_id:
            raise invalid(
                "A 'tool' message needs the 'tool_call_id' of the call it answers",
                param=f"messages[{i}].tool_call_id",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            )
    return messages


def check_structured(request: wire.GenerationRequest, max_schema_bytes: int) -> None:
    """A request's constraint (``structured``) and tools, as the API checks them: a 400 naming ``response_format``
    (``tool_choice`` for a tool constraint) for a schema past ``max_schema_bytes`` or one that does not compile."""
    constraint = request.structured
    if request.tool_choice and request.tool_choice not in TOOL_CHOICES:
        raise invalid(f"Unknown tool_choice {echo(request.tool_choice)}", param="tool_choice")
    if constraint is None:
        return
    if constraint.kind == TOOL and not request.tools:
        raise invalid("A tool constraint needs the request's 'tools'", param="tools")
    check_constraint(constraint, max_schema_bytes, "tools" if constraint.kind == TOOL else "response_format")


def check_constraint(constraint: wire.Structured, max_schema_bytes: int, param: str) -> None:
    """A 400 naming ``param`` when ``constraint``'s schema is past ``max_schema_bytes`` or does not compile."""
    found = structured.problem(constraint, max_schema_bytes)
    if found is not None:
        raise invalid(found[0], param=param, code=found[1])


def check_role(i: int, role: str) -> None:
    if role not in CHAT_ROLES:
        raise invalid(
            f"Unsupported role {echo(role)}; expected one of {', '.join(sorted(CHAT_ROLES))}",
            param=f"messages[{i}].role",
        )


def check_sampling(
    sampling: wire.SamplingParams,
    *,
    max_stop_bytes: int,
    max_param: str = "max_tokens",
    max_tokens_given: bool = True,
    stop_param: str = "stop",
) -> None:
    """Ranges of every sampling value; ``max_param`` names ``max_tokens`` in errors (chat may call it
    ``max_completion_tokens``), ``max_tokens_given`` False when it holds the default rather than the caller's value;
    ``stop_param`` names ``stop`` (Anthropic's ``stop_sequences``)."""
    at_least(max_param, sampling.max_tokens, 1)  # its upper bound is the result cap's (check_result_size)
    in_range("temperature", sampling.temperature, 0.0, 2.0)
    in_range("top_p", sampling.top_p, 0.0, 1.0)
    in_range("n", sampling.n, 1, MAX_N)
    in_range("seed", sampling.seed, INT64_MIN, INT64_MAX)
    check_result_size(sampling.n, sampling.max_tokens, max_param, max_tokens_given)
    check_stop(sampling.stop, max_stop_bytes, stop_param)
    check_logit_bias(sampling.logit_bias)
    in_range("logprobs", sampling.logprobs, 0, MAX_TOP_LOGPROBS)


def in_range(param: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not low <= value <= high:
        raise invalid(
            f"'{param}' must be between {low} and {high}, got {echo(value)}", param=param, code=ErrorCode.OUT_OF_RANGE
        )


def at_least(param: str, value: int, low: int) -> None:
    if value < low:
        raise invalid(f"'{param}' must be at least {low}, got {echo(value)}", param=param, code=ErrorCode.OUT_OF_RANGE)


def check_result_size(n: int, max_tokens: int, max_param: str, max_tokens_given: bool) -> None:
    """400 when the result could exceed MAX_RESULT_BYTES: every token decodes to at least one byte, so ``n`` choices of
    ``max_tokens`` may reach n * max_tokens bytes. Names ``max_tokens`` unless it was left at its default (then ``n``)."""
    if n * max_tokens <= MAX_RESULT_BYTES:
        return
    param = max_param if max_tokens_given else "n"
    raise invalid(
        f"n ({n}) x {max_param} ({max_tokens}) = {n * max_tokens} tokens could exceed the result limit of"
        f" {MAX_RESULT_BYTES} bytes (each token is at least one byte); reduce '{param}' so that n x"
        f" {max_param} <= {MAX_RESULT_BYTES}",
        param=param,
        code=ErrorCode.RESULT_TOO_LARGE,
    )


def check_stop(sequences: list[str], max_stop_bytes: int, param: str = "stop") -> None:
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise invalid(
            f"'{param}' allows at most {MAX_STOP_SEQUENCES} sequences, got {len(sequences)}",
            param=param,
            code=ErrorCode.TOO_MANY_VALUES,
        )
    if any(not s for s in sequences):
        raise invalid(f"'{param}' sequences must not be empty", param=param)
    if any(len(s.encode()) > max_stop_bytes for s in sequences):
        raise invalid(
            f"'{param}' sequences must be at most {max_stop_bytes} bytes (UTF-8) each",
            param=param,
            code=ErrorCode.STOP_TOO_LONG,
        )


def check_logit_bias_size(entries: int) -> None:
    if entries > MAX_LOGIT_BIAS_TOKENS:
        raise invalid(
            f"'logit_bias' allows at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {entries}",
            param="logit_bias",
            code=ErrorCode.TOO_MANY_VALUES,
        )


def bad_token_id(token: str) -> RequestError:
    """The 400 for a ``logit_bias`` key that is no token id (``token`` as the caller spelled it)."""
    return invalid(
        f"'logit_bias' keys must be token ids (integers from 0 to {INT64_MAX}), got {echo(token)}", param="logit_bias"
    )


def check_logit_bias(bias: Mapping[int, float] | None) -> None:
    """OpenAI's ``logit_bias``: token id -> bias in [-100, 100]; the worker checks the ids exist."""
    check_logit_bias_size(len(bias or ()))
    for token_id, value in (bias or {}).items():
        if not 0 <= token_id <= INT64_MAX:
            raise bad_token_id(str(token_id))
        in_range(f"logit_bias[{token_id}]", value, -100.0, 100.0)


def check_context(
    prompt_tokens: int,
    max_tokens: int,
    context_window: int,
    prompt_param: str,
    max_tokens_given: bool,
    max_param: str = "max_tokens",
) -> None:
    """400 ``context_length_exceeded`` when prompt and completion do not fit the model's window (0: unknown)."""
    if context_window <= 0 or prompt_tokens + max_tokens <= context_window:
        return
    param = max_param if max_tokens_given and prompt_tokens < context_window else prompt_param
    raise invalid(
        f"This model's maximum context length is {context_window} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_param}, {max_tokens} for the "
        f"completion). Please reduce the length of the {prompt_param} or the completion.",
        param=param,
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
    )

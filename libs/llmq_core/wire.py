"""Wire messages of llmq: frozen, keyword-only, tagged, versioned msgspec Structs.

Every Kafka value and Redis pub/sub payload is one of these. Kafka values are msgpack by default; internal producers may
send JSON instead and say so in the ``content-type`` header (see :func:`decode`). New fields get defaults; a field never
changes type. Times are epoch milliseconds (``*_ms``) unless the name says otherwise.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmq_core.constants import (
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_MSGPACK,
    HEADER_CONTENT_TYPE,
    OPENAI,
    REPLY_BODY_RESULT,
    TIERS,
    TRAFFIC_CLASSES,
)
from llmq_core.status import Outcome

SCHEMA_VERSION = 1

# Every integer field is bounded to int64 (what msgpack carries signed), so a record with an integer that cannot be
# re-encoded fails decoding (and is dead-lettered) instead of raising wherever it is encoded later.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # a count or index: never negative

TrafficClass = Literal[TRAFFIC_CLASSES]  # constants.TRAFFIC_CLASSES: the one spelling
Tier = Literal[TIERS]
Endpoint = Literal["completions", "chat.completions"]
FlushReason = Literal["size", "wait", "drain"]
FinishReason = Literal["stop", "length"]


class _Struct(msgspec.Struct, frozen=True, kw_only=True):
    """Base of plain (untagged) nested structs."""


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of top-level wire messages: tagged by ``type``, versioned by ``schema_version``."""

    schema_version: Count = SCHEMA_VERSION


# --- reply targets: where a request's outcome goes -------------------------------------------------------------------


class HttpReply(_Struct, kw_only=True, tag="http", tag_field="kind"):
    """The API pod ``instance_id`` holds the caller's connection; results go to its Redis channel."""

    instance_id: str


class KafkaReply(_Struct, kw_only=True, tag="kafka", tag_field="kind"):
    """An internal producer consumes its results from Kafka ``topic`` (JSON or msgpack per ``content_type``).

    ``body``: what each reply record holds (constants.REPLY_BODIES): ``result``, the FinalResult; ``api``, the request's
    result as its ``api_format``'s batch API writes a result line (OpenAI's batch output line, Anthropic's Message Batch
    result line). A str, not a Literal: the batcher refuses an unknown one with a clear error (param ``reply_to.body``).
    """

    topic: str
    content_type: str = CONTENT_TYPE_JSON
    body: str = REPLY_BODY_RESULT


class JobReply(_Struct, kw_only=True, tag="job", tag_field="kind"):
    """A line of batch job ``batch_id``, joined back by ``custom_id``."""

    batch_id: str
    custom_id: str


ReplyTo = HttpReply | KafkaReply | JobReply


# --- requests ----------------------------------------------------------------------------------------------------------

DEFAULT_TENANT_ID = "default"  # the tenant of a request that names none


class ToolCall(_Struct, kw_only=True):
    """One call of a function the request offered (OpenAI's ``tool_calls[*]``): ``arguments`` is JSON object text."""

    id: str
    name: str
    arguments: str


class ChatMessage(_Struct, kw_only=True):
    """``tool_calls``: the calls an assistant turn made (its ``content`` then often ""); ``tool_call_id``: the call a
    ``tool`` turn answers."""

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Tool(_Struct, kw_only=True):
    """A function the model may call: ``parameters`` is its arguments' JSON Schema as JSON text ("": any object)."""

    name: str
    description: str = ""
    parameters: str = ""


class Structured(_Struct, kw_only=True):
    """A constraint on every choice's text, enforced while decoding (structured outputs; ``llmq_core.structured``).

    ``kind`` (constants.STRUCTURED_KINDS): ``json_object`` (any JSON object), ``json_schema`` (an instance of
    ``schema``), ``tool`` (calls of the request's ``tools``: ``schema`` is that of the call list the API built). A
    str, not a Literal: a worker refuses a kind it does not know with a clear error. ``schema``: JSON Schema text;
    ``name``: the schema's name (json_schema) or the one function a named tool_choice forces (tool).
    """

    kind: str
    schema: str = ""
    name: str = ""


class SamplingParams(_Struct, kw_only=True):
    """OpenAI sampling controls. ``max_tokens`` counts completion tokens per choice; ``n`` is the number of choices.

    ``logit_bias``: token id -> bias in [-100, 100] added to that token's logit (the worker checks ids against its model's
    vocabulary). ``logprobs``: None, no logprobs; k (0..MAX_TOP_LOGPROBS): each choice carries the log probability of
    every token whose text it keeps and the k most likely alternatives at that position (see :class:`TokenLogprob`).
    """

    max_tokens: Int64 = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = []
    seed: Int64 | None = None
    n: Int64 = 1
    logit_bias: dict[Int64, float] | None = None
    logprobs: Count | None = None


class Continuation(_Struct, kw_only=True):
    """What a re-dispatched request already generated (its worker was lost): set only by a batcher, from the
    :class:`Progress` its earlier attempts wrote (``constants.progress_key``), never by a producer (the batcher
    refuses a request record that carries one). The next worker prefills the prompt plus ``token_ids[i]`` for choice i
    and generates only the rest of ``max_tokens``. ``hops``: continuations of the request so far, this one included
    (at most ``batcher.max_continuations``); ``from_attempt``: the attempt whose progress it carries."""

    version: Count = 1
    token_ids: list[list[Count]]
    hops: Count = 1
    from_attempt: Count = 0


class GenerationRequest(_Message, kw_only=True, tag="generation_request"):
    """One caller's request, as produced to ``llmq.requests.<traffic_class>`` (Kafka key = request_id).

    Exactly one of ``prompt`` (completions) and ``messages`` (chat) is set. ``deadline_ms`` is absolute (epoch ms);
    ``prompt_tokens`` is the API pod's count with the model's tokenizer (0 when the producer did not count).
    ``traceparent`` is set only while tracing is on (see ``llmq_core.tracing``).
    """

    request_id: str
    tenant_id: str = DEFAULT_TENANT_ID
    traffic_class: TrafficClass = "interactive"
    tier: Tier = "paid"
    model: str
    endpoint: Endpoint = "completions"
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = SamplingParams()
    stream: bool = False
    created_ms: Int64
    deadline_ms: Int64
    reply_to: ReplyTo
    attempt: Count = 0
    idempotency_key: str | None = None
    prompt_tokens: Count = 0
    traceparent: str | None = None  # W3C trace context of this request's latest hop (a Batch carries many requests)
    # The caller's wire format (constants.OPENAI, constants.ANTHROPIC): only how its result is rendered. A str, not a
    # Literal, so a format added later never makes an older consumer refuse the record.
    api_format: str = OPENAI
    structured: Structured | None = None  # constrained decoding (response_format, a required or named tool_choice)
    tools: list[Tool] | None = (
        None  # the functions the chat template renders (tool_choice none and auto: no constraint)
    )
    tool_choice: str = ""  # constants.TOOL_CHOICES ("": no tools); a named function: "function"
    continuation: Continuation | None = None  # set by a batcher only: the tokens earlier attempts generated


class Batch(_Message, kw_only=True, tag="batch"):
    """Requests of one model sent to one worker, produced to its partition of ``llmq.batches``."""

    batch_id: str
    worker_id: str
    model: str
    requests: list[GenerationRequest]
    formed_ms: Int64
    flush_reason: FlushReason


class Cancel(_Message, kw_only=True, tag="cancel"):
    """Drop ``request_id`` wherever it is (queued in the batcher or running on a worker)."""

    request_id: str
    reason: str = "client_disconnected"


# --- results -----------------------------------------------------------------------------------------------------------


class Usage(_Struct, kw_only=True):
    prompt_tokens: Count = 0
    completion_tokens: Count = 0
    total_tokens: Count = 0
    cached_tokens: Count = 0  # of prompt_tokens, those served from the worker's prefix cache (not prefilled again)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        """``prompt_tokens`` in (``cached_tokens`` of them from the prefix cache), ``completion_tokens`` out (every
        choice's), and their sum."""
        total = prompt_tokens + completion_tokens
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=total,
            cached_tokens=min(cached_tokens, prompt_tokens),
        )


class Timings(_Struct, kw_only=True):
    """Milliseconds: ``queued_ms`` from created to engine start, ``ttft_ms`` created to first token, ``total_ms`` to end."""

    queued_ms: Int64 = 0
    ttft_ms: Int64 = 0
    total_ms: Int64 = 0


def queued_timings(created_ms: int, finished_ms: int) -> Timings:
    """The timings of a request answered without an engine's: all of its time from created to end counts as queued."""
    waited_ms = max(0, finished_ms - created_ms)
    return Timings(queued_ms=waited_ms, total_ms=waited_ms)


class ErrorInfo(_Struct, kw_only=True):
    type: str
    message: str
    code: str | None = None
    retryable: bool = False
    param: str | None = None  # the request field at fault (OpenAI's ``param``), e.g. ``reply_to.topic``


class TopLogprob(_Struct, kw_only=True):
    """One candidate token at a position: its text (``bytes`` as UTF-8, a byte that is no character whole as ``\\xNN``),
    its UTF-8 ``bytes`` and natural-log probability under the model (before logit_bias, temperature and top_p)."""

    token: str
    logprob: float
    bytes: list[int] = []


class TokenLogprob(_Struct, kw_only=True):
    """One generated token (OpenAI's chat ``logprobs.content`` entry, field for field): as :class:`TopLogprob`, plus
    the ``top_logprobs`` most likely tokens at its position (SamplingParams.logprobs of them, most likely first)."""

    token: str
    logprob: float
    bytes: list[int] = []
    top_logprobs: list[TopLogprob] = []


class Choice(_Struct, kw_only=True):
    """``stop_sequence``: the stop string that ended the choice (finish_reason ``stop``; never part of ``text``), None
    when it ended otherwise or its worker predates the field (Anthropic's ``stop_sequence``)."""

    index: Count
    text: str
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    # SamplingParams.logprobs set: one entry per token whose text ``text`` keeps at least in part (a stop sequence or the
    # result cap cuts the text: the tokens from the cut on are left out), in order; None when not asked
    logprobs: list[TokenLogprob] | None = None
    # The calls the choice's text made (a request with tools; the text is then ""): renderers answer finish_reason
    # ``tool_calls`` for a choice that ended ``stop`` with calls.
    tool_calls: list[ToolCall] | None = None


class TokenChunk(_Message, kw_only=True, tag="token_chunk"):
    """New text of one choice of a streaming request; ``seq`` counts chunks of the request's ``attempt`` from 0.

    ``attempt`` is the GenerationRequest's: an API pod streams the chunks of one attempt only, so a client never
    receives text from two generations. ``tenant_id`` is the request's: an API pod takes a chunk only for the tenant
    it holds the request for (a FinalResult carries its own)."""

    request_id: str
    index: Count = 0
    text: str
    seq: Count
    sent_ms: Int64
    attempt: Count = 0
    tenant_id: str = ""
    logprobs: list[TokenLogprob] | None = None  # the entries (Choice.logprobs) released with this text, when asked
    # Characters of the choice's text before this chunk in its generation, counted from the request's first token
    # (a continued attempt re-sends the text its continuation holds, from 0): how an API pod joins two attempts.
    # -1: not given (a worker that predates continuations).
    offset: Int64 = -1


class FinalResult(_Message, kw_only=True, tag="final_result"):
    """The one terminal outcome of a request. Published to its pod (HTTP) and always to ``llmq.results``."""

    request_id: str
    outcome: Outcome
    model: str
    tenant_id: str = DEFAULT_TENANT_ID
    endpoint: Endpoint = "completions"
    reply_to: ReplyTo
    choices: list[Choice] = []
    usage: Usage = Usage()
    timings: Timings = Timings()
    error: ErrorInfo | None = None
    worker_id: str | None = None
    created_ms: Int64 = 0
    finished_ms: Int64 = 0
    batch_size: Count = 0
    traffic_class: TrafficClass | None = None  # the request's class (None from producers that predate it): metrics
    # Set on the answer to a re-produced request_id (a second Kafka record with the id of a known request): that record's
    # position, "<topic>/<partition>@<offset>". The result-router delivers it once per copy and never stores it.
    request_copy: str = ""
    api_format: str = OPENAI  # the request's (a result of an older worker: openai)
    tier: Tier | None = None  # the request's tier (None from workers that predate it): Anthropic's usage.service_tier

    @classmethod
    def for_request(cls, request: GenerationRequest, outcome: Outcome, *, finished_ms: int, **fields) -> FinalResult:
        """The result of ``request``, ended ``outcome`` at ``finished_ms``: the fields it shares with the request
        (:data:`RESULT_FIELDS_OF_REQUEST`) are the request's; ``fields`` are the rest (choices, usage, timings, ...)."""
        copied = {name: getattr(request, name) for name in RESULT_FIELDS_OF_REQUEST}
        return cls(outcome=outcome, finished_ms=finished_ms, **copied, **fields)


# What a FinalResult repeats of its GenerationRequest, field by field under the same name.
RESULT_FIELDS_OF_REQUEST = (
    "request_id",
    "tenant_id",
    "model",
    "endpoint",
    "reply_to",
    "created_ms",
    "traffic_class",
    "api_format",
    "tier",
)


class StreamMark(_Message, kw_only=True, tag="stream_mark"):
    """A streaming request's text reached its caller: SET by the worker at ``constants.streamed_key`` with each chunk
    (before the chunk is published) and once more, ``done``, after its result was produced. A worker that takes a
    request with a mark not ``done`` (its attempt was lost mid-stream) answers it ``stream_interrupted`` instead of
    running it again; ``completion_tokens``: what the caller received (counted by ``llmq_core.tokenizer``)."""

    attempt: Count
    completion_tokens: Count = 0
    done: bool = False


class Progress(_Message, kw_only=True, tag="progress"):
    """Token ids of choice ``index`` that attempt ``attempt`` of a request generated from position ``start`` (the
    choice's tokens before them, its continuation's included): RPUSHed by the worker at ``constants.progress_key``,
    with each stream chunk before it is published, and every ``worker.progress_interval_ms`` otherwise. A batcher
    re-dispatching the request reads them into its :class:`Continuation` (``llmq_core.continuation``)."""

    attempt: Count
    index: Count = 0
    start: Count = 0
    token_ids: list[Count]


# --- heartbeats --------------------------------------------------------------------------------------------------------


class WorkerHeartbeat(_Message, kw_only=True, tag="worker_heartbeat"):
    """A worker's capacity, sent every ``heartbeat_interval_ms`` on Redis channel ``llmq:heartbeats``.

    ``free_slots`` = ``max_slots`` - running - queued. ``fixed_batch_time_ms`` > 0 marks a fixed-time batch engine (the
    batcher then holds a short wait window). ``last_batch_id`` is the newest Batch the worker has taken from its partition,
    so the batcher can subtract batches it dispatched since then from ``free_slots``. ``preemptible``: running deferred
    sequences the worker would preempt for interactive or near-interactive work (room such work may claim beyond
    ``free_slots``; 0: none, or a worker that never preempts).
    """

    worker_id: str
    partition: Int64
    model: str
    max_slots: Int64
    running: Int64
    queued: Int64
    free_slots: Int64
    est_drain_ms: Int64
    sent_ms: Int64
    fixed_batch_time_ms: Int64 = 0
    context_window: Int64 = 0
    last_batch_id: str = ""
    preemptible: Int64 = 0


class PrefixSummary(_Message, kw_only=True, tag="prefix_summary"):
    """What a worker's prefix cache holds, sent on Redis channel ``llmq:heartbeats`` every
    ``prefix_summary_interval_ms``: the prefix-chain hashes (``llmq_core.prefixes``, blocks of ``block_bytes``) of the
    prompts whose blocks it keeps, most recently used first, at most ``prefix_summary_max_blocks``. Each summary
    replaces the last; a lost one costs affinity, never correctness. ``tenant_scoped``: the hashes are salted by
    tenant (the worker's cache shares no prefix across tenants)."""

    worker_id: str
    model: str
    block_bytes: Count
    tenant_scoped: bool = True
    blocks: list[Int64] = []
    sent_ms: Int64


class PodHeartbeat(_Message, kw_only=True, tag="pod_heartbeat"):
    """An API pod is alive; work whose pod stops sending these is cancelled."""

    instance_id: str
    sent_ms: Int64


# --- admission signals --------------------------------------------------------------------------------------------------


class QueueLoad(_Struct, kw_only=True):
    """One priority class's queue in one batcher: requests queued, the age (ms) of the oldest of them, and the rate
    its requests were dispatched at lately (requests/s, smoothed over about ``DRAIN_TAU_MS`` of the batcher)."""

    depth: Count = 0
    oldest_age_ms: Int64 = 0
    drained_per_s: float = 0.0
    # requests of this class and the classes above dispatched per second while some of them waited a whole report
    # interval: the rate a backlog drains at, scaled to the slots live now (smoothed; between backlogs the last one
    # measured; 0: never measured, or no live worker)
    backlog_drained_per_s: float = 0.0


class ModelLoad(_Struct, kw_only=True):
    """One model in one batcher: its queues by ``constants.PRIORITY_CLASSES`` entry, its live workers and their slots,
    and when a heartbeat of one of its workers last arrived (epoch ms; 0: never since the batcher started)."""

    classes: dict[str, QueueLoad] = {}
    workers: Count = 0
    slots: Int64 = 0
    worker_seen_ms: Int64 = 0
    capacity_per_s: float = 0.0  # requests/s the live workers can take by their heartbeats (slots per batch time)


class BatcherSaturation(_Message, kw_only=True, tag="batcher_saturation"):
    """A batcher's queues, HSET about once a second into ``llmq:saturation`` (field = ``batcher_id``); API pods read
    it for admission control. ``classes``: all models together; ``models``: per model (the catalogue's and those with
    workers), so one model's backlog never sheds another's traffic; ``started_ms``: when the batcher started, so a
    model no worker was ever seen for counts as gone once the worker heartbeat timeout has passed since then."""

    batcher_id: str
    sent_ms: Int64
    classes: dict[str, QueueLoad] = {}
    models: dict[str, ModelLoad] = {}
    started_ms: Int64 = 0


class PodUnfinished(_Message, kw_only=True, tag="pod_unfinished"):
    """An API pod's admitted requests that have not ended yet, per model and priority class, HSET about every 100 ms
    into ``llmq:unfinished`` (field = ``instance_id``): other pods count them as work ahead of a new request before
    any batcher has read them from Kafka."""

    instance_id: str
    sent_ms: Int64
    models: dict[str, dict[str, Count]] = {}


Message = (
    GenerationRequest
    | Batch
    | Cancel
    | TokenChunk
    | FinalResult
    | WorkerHeartbeat
    | PrefixSummary
    | PodHeartbeat
    | BatcherSaturation
    | PodUnfinished
    | StreamMark
    | Progress
)

_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_msgpack_decoder = msgspec.msgpack.Decoder(Message)
_json_decoder = msgspec.json.Decoder(Message)


def encode(message: Message | dict, content_type: str = CONTENT_TYPE_MSGPACK) -> bytes:
    """Serialise a wire message (or a plain dict: a Kafka reply's API result line) as msgpack (default) or JSON."""
    if content_type == CONTENT_TYPE_JSON:
        return _json_encoder.encode(message)
    return _msgpack_encoder.encode(message)


def decode(data: bytes, content_type: str | None = None) -> Message:
    """Parse a wire message. JSON when ``content_type`` says so or the payload starts with ``{``; msgpack otherwise.

    Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for undecodable or invalid payloads.
    """
    return (_json_decoder if is_json(data, content_type) else _msgpack_decoder).decode(data)


def is_json(data: bytes, content_type: str | None) -> bool:
    """Whether a payload is JSON (else msgpack): its ``content_type`` says so, or it has none and starts with ``{``."""
    return content_type == CONTENT_TYPE_JSON or (content_type is None and data[:1] == b"{")


def content_type_of(headers: list[tuple[str, bytes]] | tuple | None) -> str | None:
    """The ``content-type`` header value of a Kafka record, if any."""
    for key, value in headers or ():
        if key == HEADER_CONTENT_TYPE:
            return value.decode()
    return None


def decode_record(value: bytes | None, headers: list[tuple[str, bytes]] | tuple | None) -> Message:
    """Parse a consumed Kafka record from any producer (format from its ``content-type`` header, as :func:`decode`).

    Raises only ``msgspec.DecodeError`` / ``msgspec.ValidationError``, also for a null value, a header that is not
    UTF-8, or nesting too deep for the decoder, so a consumer can dead-letter every bad record the same way.
    """
    if value is None:
        raise msgspec.DecodeError("The record has no value")
    try:
        return decode(value, content_type_of(headers))
    except (RecursionError, UnicodeDecodeError) as exc:
        raise msgspec.DecodeError(f"Undecodable record: {exc}") from None

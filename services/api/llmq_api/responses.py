"""ASGI responses that hold the connection until the request's resolution: one JSON body, or an SSE stream.

Both watch the connection themselves (``receive`` -> ``http.disconnect``) so a client that leaves resolves its waiter
at once and a Cancel goes out; neither writes anything once the client is gone. What they write is the caller's
:class:`Dialect`'s (OpenAI's by default, Anthropic's for ``/v1/messages``): one path inside, two wire formats at its edge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from llmq_api.errors import RETRY_AFTER_S, ApiError, unavailable
from llmq_api.exchange import CancelPublisher, wait_for_resolution
from llmq_api.metrics import ApiMetrics
from llmq_api.openai_format import CLIENT_GONE_STATUS, OPENAI, error_for, outcome_label
from llmq_api.sse import KeepAlive
from llmq_api.stream_events import StreamEvents, events_not_kept
from llmq_api.waiters import Abandoned, DeadlineExceeded, Resolution, Waiter, WaiterRegistry
from llmq_core import tracing, wire
from llmq_core.clock import Clock
from llmq_core.constants import ANTHROPIC, HTTP_REQUEST_ID, HTTP_TIMEOUT_MS, HTTP_TRAFFIC_CLASS
from llmq_core.settings import ApiSettings
from llmq_core.status import ErrorCode

log = logging.getLogger(__name__)

KEEP_ALIVE_S = ApiSettings.model_fields["sse_keep_alive_ms"].default / 1000  # the setting's default

# What a request still waiting when the pod's drain runs out gets (uvicorn cancels it): its Cancel went out, retry it.
SHUTTING_DOWN = unavailable("The server is shutting down; retry the request", RETRY_AFTER_S, code="shutting_down")
# A stream whose result is not the generation its chunks came from (a race with a re-run): it ends rather than mix them.
INTERRUPTED = unavailable(
    "The stream was interrupted: its result is of another generation than the text sent. Retry the request.",
    RETRY_AFTER_S,
    code=ErrorCode.STREAM_INTERRUPTED,
)


class StreamEncoder(Protocol):
    """The bytes of one request's stream in its caller's dialect."""

    def opening(self) -> bytes:
        """What goes out before any text (may be empty)."""
        ...

    def text(self, index: int, text: str, logprobs: list[wire.TokenLogprob] | None = None) -> bytes:
        """New ``text`` of choice ``index`` and the logprob entries of its tokens (None: not asked)."""
        ...

    def closing(self, result: wire.FinalResult, sent: dict[int, str]) -> bytes:
        """The end of a succeeded stream: the text of ``result`` not ``sent`` yet, how it ended, the terminator."""
        ...

    def failure(self, error: ApiError) -> bytes:
        """The end of a failed stream: ``error`` as an event, then the terminator."""
        ...


class Dialect(Protocol):
    """A caller's wire format: how a result, an error and a stream look to it (see ``llmq_api.openai_format`` and
    ``llmq_api.anthropic_format``)."""

    def body(self, result: wire.FinalResult, pending: PendingRequest) -> dict:
        """The JSON body of a succeeded ``result`` of ``pending``."""
        ...

    def error(self, error: ApiError, request_id: str | None) -> tuple[int, dict, dict[str, str]]:
        """(status, JSON body, headers) of ``error``, a refusal or failure of request ``request_id``."""
        ...

    def headers(self, request_id: str) -> dict[str, str]:
        """Headers every response to request ``request_id`` carries besides ``x-request-id``."""
        ...

    def stream(self, pending: PendingRequest) -> StreamEncoder: ...


@dataclass(eq=False, repr=False, kw_only=True)
class PendingRequest:
    """Everything one held connection needs: the produced request, its waiter, and the pod's shared parts.

    ``on_gave_up`` runs once the pod gave up on the request (its deadline passed or its client left);
    ``on_resolved`` is called once with the resolution, however the wait ends (it must not block: it is called while
    the wait may be being cancelled); ``headers`` are added to the response.
    """

    request: wire.GenerationRequest
    waiter: Waiter
    include_usage: bool
    registry: WaiterRegistry
    publish_cancel: CancelPublisher
    metrics: ApiMetrics
    clock: Clock
    on_gave_up: Callable[[], Awaitable[None]] | None = None
    on_resolved: Callable[[Resolution], None] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    last_event_id: int | None = None  # a resumed stream: the id of the last event its client got
    started_s: float = field(init=False, default_factory=time.perf_counter)
    first_text_s: float | None = field(init=False, default=None)  # streaming: accepted (created_ms) to the first text

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def created_s(self) -> int:
        return self.request.created_ms // 1000

    async def resolution(self, receive: Receive, on_chunk=None) -> Resolution:
        """Wait for the resolution, giving up at the request's deadline or when the client disconnects."""
        remaining_s = max(0.0, (self.request.deadline_ms - self.clock.now_ms()) / 1000)
        try:
            resolution = await wait_for_resolution(
                self.registry,
                self.waiter,
                deadline=_deadline(remaining_s),
                client_gone=_disconnected(receive),
                publish_cancel=self.publish_cancel,
                on_chunk=on_chunk,
            )
        finally:  # the wait resolved the waiter however it ended
            if self.on_resolved is not None:
                self.on_resolved(self.waiter.resolution)
        if isinstance(resolution, wire.FinalResult) and tracing.enabled():  # worker finished -> Redis -> this pod
            tracing.record_span(
                "api.reply",
                resolution.finished_ms,
                self.clock.now_ms(),
                attributes={"llmq.request_id": self.request_id, "llmq.outcome": resolution.outcome.value},
            )
        if self.on_gave_up is not None and isinstance(resolution, (Abandoned, DeadlineExceeded)):
            await self.on_gave_up()
        return resolution

    def since_accepted_s(self) -> float:
        """Seconds since the pod accepted the request (``created_ms``: before producing it, as the workers count)."""
        return max(0, self.clock.now_ms() - self.request.created_ms) / 1000

    @property
    def endpoint_label(self) -> str:
        """The ``endpoint`` of its metrics: the wire endpoint, or ``messages`` for Anthropic's Messages API."""
        return "messages" if self.request.api_format == ANTHROPIC else self.request.endpoint

    def record(self, resolution: Resolution, status: int) -> None:
        self.metrics.finished(
            self.endpoint_label, outcome_label(resolution), status, time.perf_counter() - self.started_s
        )
        ttft_s = self.first_text_s
        if ttft_s is None and isinstance(resolution, wire.FinalResult) and resolution.timings.ttft_ms:
            ttft_s = resolution.timings.ttft_ms / 1000
        self.metrics.answered(
            self.request.traffic_class,
            self.request.model,
            status,
            None if isinstance(resolution, Abandoned) else self.since_accepted_s(),
            ttft_s,
        )


def _deadline(remaining_s: float) -> asyncio.Future:
    """A future done ``remaining_s`` from now, by a timer that cancelling it cancels: unlike ``asyncio.sleep`` it
    needs no task of its own per request (a task's start and cancel are loop callbacks too)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    timer = loop.call_later(remaining_s, _set_done, future)
    future.add_done_callback(lambda _: timer.cancel())
    return future


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _disconnected(receive: Receive) -> None:
    """Completes when the client has gone (the request body was already read, so only disconnects arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _headers(
    pending: PendingRequest, dialect: Dialect, content_type: bytes, extra: dict[str, str] | None = None
) -> list:
    request = pending.request
    headers = [(b"content-type", content_type), (HTTP_REQUEST_ID.encode(), pending.request_id.encode())]
    applied = {  # the class and the timeout this request runs under (from its headers, the SDK's, or the default)
        HTTP_TRAFFIC_CLASS: request.traffic_class,
        HTTP_TIMEOUT_MS: str(request.deadline_ms - request.created_ms),
    }
    merged = {**applied, **dialect.headers(pending.request_id), **pending.headers, **(extra or {})}
    headers += [(k.encode(), v.encode()) for k, v in merged.items()]
    return headers


class ResultResponse(Response):
    """Non-streaming: waits for the resolution, then sends one JSON body (the completion or an error) in
    ``dialect``."""

    def __init__(self, pending: PendingRequest, dialect: Dialect = OPENAI) -> None:  # no Response.__init__
        self.pending = pending
        self.dialect = dialect
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pending, dialect = self.pending, self.dialect
        try:
            resolution = await pending.resolution(receive)
        except asyncio.CancelledError:  # the pod's drain ran out of time: hand the request back to its client
            status, payload, extra = dialect.error(SHUTTING_DOWN, pending.request_id)
            await _send_json(send, pending, dialect, status, payload, extra)
            pending.record(pending.waiter.resolution, status)
            return
        error = error_for(resolution)
        if isinstance(resolution, Abandoned):
            pending.record(resolution, CLIENT_GONE_STATUS)
            return
        if error is None:
            status, payload, extra = 200, dialect.body(resolution, pending), None
        else:
            status, payload, extra = dialect.error(error, pending.request_id)
        await _send_json(send, pending, dialect, status, payload, extra)
        pending.record(resolution, status)


async def _send_json(
    send: Send, pending: PendingRequest, dialect: Dialect, status: int, payload: dict, extra: dict | None
) -> None:
    body = msgspec.json.encode(payload)
    headers = _headers(pending, dialect, b"application/json", extra) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class StreamResponse(Response):
    """``stream: true``: a 200 ``text/event-stream`` in ``dialect`` (OpenAI's chunks, Anthropic's events), each text
    written as soon as its TokenChunk arrives.

    Ends with the dialect's closing events (OpenAI: the finish chunks, the usage chunk when asked, ``[DONE]``), or its
    error event. Text the chunks missed is taken from the FinalResult, so the stream always adds up to the result's
    text; a result that does not extend the text sent (another generation) ends the stream with
    ``stream_interrupted`` instead. Events carry ids, and a resumed stream writes only what follows its
    ``last_event_id`` (``llmq_api.stream_events``).
    """

    def __init__(
        self, pending: PendingRequest, dialect: Dialect = OPENAI, keep_alive_s: float = KEEP_ALIVE_S
    ) -> None:  # no Response.__init__
        self.pending = pending
        self.dialect = dialect
        self.keep_alive_s = keep_alive_s
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pending = self.pending
        fmt = self.dialect.stream(pending)
        events = StreamEvents(fmt.text, pending.last_event_id, ids=pending.request.idempotency_key is not None)
        keep_alive: KeepAlive | None = None

        async def write(data: bytes) -> None:
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
                if keep_alive is not None:
                    keep_alive.wrote()

        async def on_chunk(chunk: wire.TokenChunk) -> None:
            first = not events.written
            data = events.text(chunk.index, chunk.text, chunk.logprobs)
            if not data:  # nothing reached the client (it has it, or the stream holds its text back: tools)
                return
            if first and pending.last_event_id is None:
                pending.first_text_s = pending.since_accepted_s()
                pending.metrics.child(pending.metrics.ttft, pending.endpoint_label).observe(
                    time.perf_counter() - pending.started_s
                )
            await write(data)

        headers = _headers(
            pending,
            self.dialect,
            b"text/event-stream; charset=utf-8",
            {"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await write(events.opening(fmt.opening()))
        keep_alive = KeepAlive(write, self.keep_alive_s)
        try:
            resolution = await pending.resolution(receive, on_chunk)
        except asyncio.CancelledError:  # the pod's drain ran out of time: end the stream with a retryable error
            await keep_alive.stop()
            await send({"type": "http.response.body", "body": fmt.failure(SHUTTING_DOWN), "more_body": False})
            pending.record(pending.waiter.resolution, SHUTTING_DOWN.status)
            return
        await keep_alive.stop()
        if isinstance(resolution, Abandoned):
            pending.record(resolution, CLIENT_GONE_STATUS)
            return
        error = error_for(resolution)
        if error is None and not events.catch_up(resolution):
            error = events_not_kept(pending.request_id)
            pending.metrics.stream_resumes.labels("failed").inc()
        if error is None and not _extends(resolution, events.sent):
            error = INTERRUPTED
        end = events.closing(fmt.closing(resolution, events.sent), resolution) if error is None else fmt.failure(error)
        await send({"type": "http.response.body", "body": end, "more_body": False})
        pending.record(resolution, 200 if error is None else error.status)


def _extends(result: wire.FinalResult, sent: dict[int, str]) -> bool:
    """Whether every choice of ``result`` starts with the text already sent of it (one generation)."""
    texts = {choice.index: choice.text for choice in result.choices}
    return all(texts.get(index, "").startswith(text) for index, text in sent.items())

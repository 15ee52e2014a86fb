"""OpenTelemetry tracing of llmq: one trace per request, api -> Kafka -> batcher -> worker -> Redis -> api (and the
result-router behind llmq.results).

W3C trace context travels in Kafka record headers (``constants.HEADER_TRACEPARENT``) and, because a Batch holds many
requests, in each ``GenerationRequest.traceparent``. Every hop records its spans and rewrites the request's
``traceparent`` to its own last span, so the next hop nests under it:

    api ``POST /v1/...`` (server) > ``kafka.produce`` > batcher ``batcher.queue`` > ``batcher.flush`` >
    worker ``worker.request`` > ``worker.queue`` | ``worker.prefill`` | ``worker.decode`` | ``worker.publish``
    > result-router ``result_router.route``; and the api's ``api.reply`` (worker finished -> reply read from Redis).

:func:`configure` installs the SDK from settings (``tracing_exporter``: none | console | otlp | file). With ``none``
nothing is installed: :func:`enabled` is False and every helper here returns at its first line, so an instrumented hot
path pays one global read. Spans are kept on a private TracerProvider (not the global one), so tests can reconfigure.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

from llmq_core.constants import HEADER_TRACEPARENT
from llmq_core.settings import Settings

__all__ = [
    "SpanKind",
    "configure",
    "enabled",
    "shutdown",
    "start_span",
    "record_span",
    "end",
    "traceparent_of",
    "request_attributes",
    "annotate_current",
    "parse",
    "header_traceparent",
    "with_traceparent",
    "trace_id_of",
    "current_ids",
    "use_span",
    "AsgiTracing",
    "JsonFileExporter",
    "span_record",
]

_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
_NS_PER_MS = 1_000_000


def enabled() -> bool:
    """True once :func:`configure` installed an exporter: only then do the helpers record anything."""
    return _tracer is not None


def configure(service: str, settings: Settings, *, exporter: SpanExporter | None = None) -> bool:
    """Install tracing for this process (``service``: api, batcher, worker, result-router) from ``settings``.

    ``exporter`` overrides ``settings.tracing_exporter`` and exports each span as it ends (tests pass an
    ``InMemorySpanExporter``); configured exporters batch in a background thread. Returns :func:`enabled`.
    Raises ImportError for ``otlp`` without opentelemetry-exporter-otlp installed.
    """
    global _tracer, _provider
    shutdown()
    if exporter is None and settings.observability.tracing_exporter == "none":
        return False
    resource = Resource.create(
        {
            "service.name": f"llmq-{service}",
            "service.namespace": "llmq",
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.observability.tracing_sample_ratio))
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(service, settings), schedule_delay_millis=1000))
    _provider, _tracer = provider, provider.get_tracer("llmq")
    return True


def _exporter(service: str, settings: Settings) -> SpanExporter:
    kind = settings.observability.tracing_exporter
    if kind == "console":
        return ConsoleSpanExporter(service_name=f"llmq-{service}")
    if kind == "file":
        return JsonFileExporter(Path(settings.observability.tracing_file_dir) / f"{service}-{os.getpid()}.jsonl")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.observability.tracing_otlp_endpoint or None)


def shutdown() -> None:
    """Export what is pending and switch tracing off (call at process exit; a no-op when tracing is off)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# --- spans -------------------------------------------------------------------------------------------------------------


def start_span(
    name: str,
    *,
    parent: str | Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    start_ms: int | None = None,
    attributes: Mapping[str, object] | None = None,
) -> Span | None:
    """A started span, or None when tracing is off. End it with :func:`end`.

    ``parent``: a traceparent string, a Context, or None; a missing or malformed one falls back to the current context
    (a new trace where there is none). ``start_ms``: epoch ms when it began (spans recorded after the fact); default now.
    """
    if _tracer is None:
        return None
    context = parse(parent) if isinstance(parent, str) else parent
    start_ns = start_ms * _NS_PER_MS if start_ms else None
    return _tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_ns)


def end(span: Span | None, end_ms: int | None = None) -> None:
    """End ``span`` (None: nothing) at ``end_ms`` (epoch ms; default now)."""
    if span is not None:
        span.end(end_time=end_ms * _NS_PER_MS if end_ms else None)


def record_span(
    name: str,
    start_ms: int,
    end_ms: int,
    *,
    parent: str | Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, object] | None = None,
) -> Span | None:
    """A span recorded after the fact, from ``start_ms`` to ``end_ms`` (epoch ms). Returns it (ended), or None."""
    if _tracer is None:
        return None
    span = start_span(name, parent=parent, kind=kind, start_ms=start_ms, attributes=attributes)
    span.end(end_time=max(end_ms, start_ms) * _NS_PER_MS)
    return span


def request_attributes(request) -> dict[str, str]:
    """Span attributes naming a GenerationRequest: id, class, tier, tenant, model."""
    return {
        "llmq.request_id": request.request_id,
        "llmq.traffic_class": request.traffic_class,
        "llmq.tier": request.tier,
        "llmq.tenant_id": request.tenant_id,
        "llmq.model": request.model,
    }


def annotate_current(attributes: Mapping[str, object]) -> None:
    """Add ``attributes`` to the current span (the API's server span inside a request); nothing when tracing is off."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def use_span(span: Span | None):
    """Context manager: ``span`` is the current span inside (the JSON logs then carry its trace_id); ends it on exit."""
    return trace.use_span(span or trace.INVALID_SPAN, end_on_exit=span is not None)


# --- W3C trace context ---------------------------------------------------------------------------------------------------


def traceparent_of(span: Span | None) -> str | None:
    """The W3C ``traceparent`` of ``span`` (``00-<trace id>-<span id>-<flags>``), or None."""
    if span is None:
        return None
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse(traceparent: str | None) -> Context | None:
    """The Context of a ``traceparent`` value, or None when it is missing or malformed."""
    parts = traceparent.split("-") if traceparent and len(traceparent) == 55 else ()
    if len(parts) != 4 or parts[0] != "00":
        return None
    try:
        ctx = SpanContext(
            trace_id=int(parts[1], 16),
            span_id=int(parts[2], 16),
            is_remote=True,
            trace_flags=TraceFlags(int(parts[3], 16)),
        )
    except ValueError:
        return None
    if not ctx.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def header_traceparent(headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    """The ``traceparent`` header of a Kafka record (or ASGI-style byte headers), if any."""
    for key, value in headers or ():
        if key == HEADER_TRACEPARENT or key == b"traceparent":
            return value.decode("latin-1")
    return None


def with_traceparent(headers: list[tuple[str, bytes]], traceparent: str | None) -> list[tuple[str, bytes]]:
    """``headers`` plus a ``traceparent`` header when there is one (a new list; ``headers`` is unchanged)."""
    if traceparent is None:
        return headers
    return [*headers, (HEADER_TRACEPARENT, traceparent.encode())]


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id inside a ``traceparent`` value, or None."""
    if traceparent and len(traceparent) == 55:
        return traceparent[3:35]
    return None


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span as hex, or None when there is none (or tracing is off)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


# --- the API pod's server span -------------------------------------------------------------------------------------------


class AsgiTracing:
    """ASGI middleware: a SERVER span around each HTTP request under ``prefixes`` (continuing a client's
    ``traceparent`` header), current for the handler and the whole response, with method, route and status."""

    def __init__(self, app, prefixes: Sequence[str] = ("/v1/",)) -> None:
        self.app = app
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope, receive, send) -> None:
        if _tracer is None or scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        span = start_span(
            f"{method} {path}",
            parent=parse(header_traceparent(scope.get("headers"))),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )

        async def send_traced(message) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
            await send(message)

        with trace.use_span(span, end_on_exit=True):
            await self.app(scope, receive, send_traced)


# --- a file exporter, for private stacks and tests across processes -------------------------------------------------------


class JsonFileExporter(SpanExporter):
    """Appends one JSON object per span to ``path``: trace_id, span_id, parent_id (hex), name, kind, service,
    start_ns, end_ns, attributes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self._file.write(json.dumps(span_record(span), separators=(",", ":")) + "\n")
        self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


def span_record(span: ReadableSpan) -> dict:
    """A finished span as a plain dict (the file exporter's line)."""
    ctx, parent = span.context, span.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "service": span.resource.attributes.get("service.name"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
    }

"""Logging set-up shared by the services: one JSON object a line, with the service name and region.

Lines about a request carry ``request_id`` (pass it as ``extra``) and ``trace_id``: an explicit ``extra`` one (see
:func:`request_fields`), else the current span's (with ``span_id``) while tracing is on. Any of :data:`FIELDS` passed as
``extra`` becomes a field of its own: what a client chose (a path, an id) goes there, JSON-escaped, never into ``msg``.
"""

from __future__ import annotations

import logging
import sys

import msgspec
from opentelemetry import trace

from llmq_core.ids import DEFAULT_REGION
from llmq_core.tracing import trace_id_of

_encoder = msgspec.json.Encoder()

# The ``extra`` keys written as fields: ids, and the access log's (llmq_api.access_log) parts of an HTTP request
FIELDS = ("request_id", "batch_id", "worker_id", "trace_id", "method", "route", "status", "tenant", "latency_ms")


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, region: str = DEFAULT_REGION) -> None:
        super().__init__()
        self.service = service
        self.region = region

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "service": self.service,
            "region": self.region,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in FIELDS:
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if "trace_id" not in entry:
            span = trace.get_current_span().get_span_context()
            if span.is_valid:
                entry["trace_id"], entry["span_id"] = f"{span.trace_id:032x}", f"{span.span_id:016x}"
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(entry).decode()


def request_fields(request_id: str, traceparent: str | None = None) -> dict:
    """``extra`` for a log line about a request: its request_id and, when its ``traceparent`` is known, trace_id."""
    trace_id = trace_id_of(traceparent)
    return {"request_id": request_id, "trace_id": trace_id} if trace_id else {"request_id": request_id}


def setup_logging(service: str, level: str = "INFO", region: str = DEFAULT_REGION) -> None:
    """Send every log record to stderr as JSON; quiet the chatty client libraries."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, region))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Our lines carry none of the caller's file and line, thread or process (logging HOWTO, "Optimization"): skip
    # collecting them for every record (the API pod writes one access line per request).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    for noisy in ("aiokafka", "kafka", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

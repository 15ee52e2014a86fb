"""JSON log lines carry trace_id: from the current span, or from a request's traceparent given as ``extra``."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmq_core import tracing
from llmq_core.settings import Settings
from llmq_core.telemetry import JsonFormatter, request_fields

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def line(msg: str, **extra) -> dict:
    record = logging.LogRecord("llmq.test", logging.INFO, __file__, 1, msg, None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return json.loads(JsonFormatter("api").format(record))


def test_request_fields_give_request_id_and_trace_id():
    entry = line("m", **request_fields("r1", TP))
    assert entry["request_id"] == "r1" and entry["trace_id"] == TP[3:35]
    assert "trace_id" not in line("m", **request_fields("r1", None))


def test_current_span_trace_id_on_every_line_inside_it():
    tracing.configure("test", Settings(), exporter=InMemorySpanExporter())
    try:
        span = tracing.start_span("s", parent=TP)
        with tracing.use_span(span):
            entry = line("inside", request_id="r1")
        assert entry["trace_id"] == TP[3:35] and entry["span_id"] == f"{span.get_span_context().span_id:016x}"
        assert "trace_id" not in line("outside")
    finally:
        tracing.shutdown()

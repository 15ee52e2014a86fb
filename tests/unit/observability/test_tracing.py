"""llmq_core.tracing: W3C context round trips, the off switch, spans recorded after the fact, the ASGI server span."""

from __future__ import annotations

import json

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from llmq_core import tracing
from llmq_core.settings import Settings

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.configure("test", Settings(), exporter=exporter)
    yield exporter
    tracing.shutdown()


def test_off_by_default_and_every_helper_is_a_no_op():
    assert not tracing.configure("test", Settings())
    assert not tracing.enabled()
    assert tracing.start_span("x") is None
    assert tracing.record_span("x", 1, 2) is None
    assert tracing.traceparent_of(None) is None
    tracing.end(None)


def test_traceparent_round_trip_and_rejects_malformed(spans):
    span = tracing.start_span("child", parent=TP)
    tracing.end(span)
    value = tracing.traceparent_of(span)
    assert tracing.trace_id_of(value) == "0af7651916cd43dd8448eb211c80319c"
    assert tracing.parse(value) is not None
    for bad in (
        None,
        "",
        "garbage",
        TP.replace("00-", "ff-", 1),
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        TP[:-2] + "zz",
    ):
        assert tracing.parse(bad) is None
    assert spans.get_finished_spans()[0].parent.span_id == 0xB7AD6B7169203331


def test_record_span_keeps_given_times_and_parent(spans):
    span = tracing.record_span(
        "worker.queue", 1_700_000_000_000, 1_700_000_000_250, parent=TP, attributes={"llmq.request_id": "r1"}
    )
    (done,) = spans.get_finished_spans()
    assert done is not None and span is not None
    assert (done.end_time - done.start_time) == 250 * 1_000_000
    assert done.context.trace_id == int(TP[3:35], 16)
    assert done.attributes["llmq.request_id"] == "r1"


def test_headers_carry_the_traceparent():
    headers = tracing.with_traceparent([("content-type", b"application/msgpack")], TP)
    assert tracing.header_traceparent(headers) == TP
    assert tracing.with_traceparent([], None) == []
    assert tracing.header_traceparent(None) is None


async def test_asgi_server_span_continues_the_client_trace_and_records_status(spans):
    seen = {}

    async def handler(request):
        seen["ids"] = tracing.current_ids()
        return PlainTextResponse("ok", status_code=201)

    app = tracing.AsgiTracing(Starlette(routes=[Route("/v1/x", handler, methods=["POST"]), Route("/healthz", handler)]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/v1/x", headers={"traceparent": TP})).status_code == 201
        traced = seen.pop("ids")
        await client.get("/healthz")
    (server,) = spans.get_finished_spans()
    assert server.name == "POST /v1/x" and server.kind is tracing.SpanKind.SERVER
    assert server.attributes["http.response.status_code"] == 201
    assert traced == (TP[3:35], f"{server.context.span_id:016x}")
    assert seen["ids"] is None  # /healthz is not traced


def test_file_exporter_writes_one_json_line_per_span(tmp_path):
    settings = Settings(observability={"tracing_exporter": "file", "tracing_file_dir": str(tmp_path)})
    assert tracing.configure("batcher", settings)
    tracing.end(tracing.start_span("a", parent=TP))
    tracing.shutdown()
    (path,) = tmp_path.iterdir()

    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["trace_id"] == TP[3:35] and line["parent_id"] == TP[36:52]
    assert line["service"] == "llmq-batcher" and line["name"] == "a"

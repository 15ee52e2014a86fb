"""cli/llmq_bench/light_timeline.py: spans to median offsets after each trace's API server span."""

import json

from llmq_bench.light_timeline import read_spans, result, timeline


def span(trace, service, name, start_ms, end_ms, kind="INTERNAL"):
    return {"trace_id": trace, "service": service, "name": name, "kind": kind, "start_ns": int(start_ms * 1e6),
            "end_ns": int(end_ms * 1e6)}  # fmt: skip


SPANS = [
    span("warm", "llmq-api", "POST /v1/completions", 10, 30, kind="SERVER"),  # before since_ns: warm-up
    span("warm", "llmq-api", "kafka.produce", 10, 20),
    span("t1", "llmq-api", "POST /v1/completions", 100, 112, kind="SERVER"),
    span("t1", "llmq-batcher", "batcher.flush", 103, 104),
    span("t1", "llmq-api", "kafka.produce", 100.5, 101.5),
    span("t2", "llmq-api", "POST /v1/completions", 500, 516, kind="SERVER"),
    span("t2", "llmq-batcher", "batcher.flush", 505, 507),
    span("t2", "llmq-api", "kafka.produce", 500.5, 502.5),
    span("t3", "llmq-result-router", "result_router.route", 900, 901),  # no API server span
]


def test_offsets_are_medians_after_each_traces_server_span_earliest_first():
    rows = timeline(SPANS, since_ns=int(50 * 1e6))
    assert [row["span"] for row in rows] == [
        "llmq-api:POST /v1/completions",
        "llmq-api:kafka.produce",
        "llmq-batcher:batcher.flush",
    ]
    assert rows[0] == {"span": "llmq-api:POST /v1/completions", "count": 2, "start_p50_ms": 0.0, "end_p50_ms": 14.0}
    assert (rows[1]["start_p50_ms"], rows[1]["end_p50_ms"]) == (0.5, 2.0)
    assert (rows[2]["start_p50_ms"], rows[2]["end_p50_ms"]) == (4.0, 5.5)


def test_warm_up_traces_count_without_a_cutoff():
    assert timeline(SPANS)[0]["count"] == 3


def test_a_run_reads_every_services_file_and_reports_overhead(tmp_path):
    for service in ("api", "batcher"):
        lines = [json.dumps(s) for s in SPANS if s["service"] == f"llmq-{service}"]
        (tmp_path / f"{service}-1.jsonl").write_text("\n".join(lines) + "\n")
    spans = read_spans(tmp_path)
    assert len(spans) == len(SPANS) - 1
    run = result([10.0, 12.0, 14.0], 0, spans, int(50 * 1e6), engine_ms=5)
    assert run["requests"] == 3 and run["e2e_p50_ms"] == 12.0 and run["overhead_p50_ms"] == 7.0
    assert len(run["spans"]) == 3

"""Where a request's time goes at 1 in flight (``llmq bench timeline``): the median start and end of every span,
relative to the API pod's server span, from a private stack with tracing to JSON-lines files
(``LLMQ_TRACING_EXPORTER=file``), after sequential non-streaming completions driven like ``llmq bench pipeline``'s.

Tracing itself adds a few ms end to end (compare ``llmq bench pipeline``'s untraced 1-in-flight p50), and the worker's
phases are recorded to the millisecond: the spans show the order and rough size of each step, not sub-millisecond
costs.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from llmq_bench.pipeline import PipelineConfig, closed_loop, latency_figures


def tracing_env(trace_dir: Path) -> dict[str, str]:
    """The services' environment for spans as JSON lines under ``trace_dir`` (what :func:`read_spans` reads)."""
    return {"LLMQ_TRACING_EXPORTER": "file", "LLMQ_TRACING_FILE_DIR": str(trace_dir)}


def drive(base_url: str, cfg: PipelineConfig) -> tuple[list[float], int, int]:
    """``cfg.warmup`` then ``cfg.light_requests`` completions one at a time: (latencies ms of the measured successes,
    failures, wall-clock ns when the measured requests began)."""
    asyncio.run(closed_loop([base_url], cfg, 1, cfg.warmup))
    since_ns = time.time_ns()
    latencies, _, failures = asyncio.run(closed_loop([base_url], cfg, 1, cfg.light_requests))
    return latencies, failures, since_ns


def read_spans(trace_dir: Path) -> list[dict]:
    """Every span the services' file exporters wrote under ``trace_dir`` (read after the stack stopped: its
    exporters flush at exit)."""
    return [json.loads(line) for path in sorted(trace_dir.glob("*.jsonl")) for line in path.open(encoding="utf-8")]


def timeline(spans: Iterable[dict], since_ns: int = 0) -> list[dict]:
    """Per ``service:name``, the median start and end in ms after its trace's API server span started, earliest
    first. ``spans``: the file exporter's records (``trace_id``, ``service``, ``name``, ``kind``, ``start_ns``,
    ``end_ns``); only traces whose API server span started at or after ``since_ns`` (wall clock) count, so warm-up
    requests and traces without one (the router's own) are left out."""
    traces: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        traces[span["trace_id"]].append(span)
    offsets: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for trace in traces.values():
        roots = [s["start_ns"] for s in trace if s["service"] == "llmq-api" and s["kind"] == "SERVER"]
        if not roots or min(roots) < since_ns:
            continue
        zero = min(roots)
        for span in trace:
            starts, ends = offsets[f"{span['service']}:{span['name']}"]
            starts.append((span["start_ns"] - zero) / 1e6)
            ends.append((span["end_ns"] - zero) / 1e6)
    rows = [
        {
            "span": key,
            "count": len(starts),
            "start_p50_ms": round(statistics.median(starts), 3),
            "end_p50_ms": round(statistics.median(ends), 3),
        }
        for key, (starts, ends) in offsets.items()
    ]
    return sorted(rows, key=lambda row: (row["start_p50_ms"], row["end_p50_ms"]))


def result(latencies: list[float], failures: int, spans: list[dict], since_ns: int, engine_ms: float) -> dict:
    """The JSON of a run: end-to-end figures (traced) and the span table."""
    return {
        "requests": len(latencies),
        "failures": failures,
        **latency_figures(latencies, engine_ms),
        "spans": timeline(spans, since_ns),
    }

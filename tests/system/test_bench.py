"""``llmq bench`` against a real private stack (two API pods, batcher, two llmq-sim workers) for a few seconds."""

from __future__ import annotations

import pytest

from tests import ports
from tests.stacks import run_bench, sim_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
BATCH_TIME_MS = 200


@pytest.fixture(scope="module")
def stack(infra):
    with sim_stack(infra, API_PORTS, batch_time_ms=BATCH_TIME_MS, sim_workers=2) as running:
        yield running


def test_bench_reports_every_request_per_class_with_batch_stats(stack, tmp_path):
    report = run_bench(
        stack,
        tmp_path,
        rate=25,
        duration_s=3,
        count=60,
        classes="interactive=0.7,near_interactive=0.3",
        stream_share=0.5,
        slo_ms=10000,
        timeout_s=30,
    )

    assert 20 <= report["requests"] <= 60
    assert report["status"] == {"ok": report["requests"]}, (report["status"], report["errors"])
    assert report["good"] == report["requests"] and report["goodput_ratio"] == 1.0
    assert set(report["classes"]) == {"interactive", "near_interactive"}
    assert sum(c["requests"] for c in report["classes"].values()) == report["requests"]
    # Every request went through a simulated batch: none is faster than one batch time.
    assert min(c["latency_ms"]["p50"] for c in report["classes"].values()) >= BATCH_TIME_MS
    assert 0 < report["ttft_ms"]["p50"] <= report["latency_ms"]["p99"]
    # The batcher's counters moved by exactly this run's requests.
    batches = report["batches"]
    assert batches["requests"] == report["requests"] and 1 <= batches["batches"] <= report["requests"]
    assert batches["fill"] == pytest.approx(batches["mean_size"] / 64)

"""llmq slo: quantiles from histogram buckets, summed over pods, per traffic class; deferred completion by deadline."""

from __future__ import annotations

import math

import pytest

from llmq_api.metrics import ApiMetrics
from llmq_cli.slo import Samples, histogram_quantile, report
from llmq_core import metrics, wire


def test_quantile_interpolates_within_its_bucket_like_promql():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.1 + 0.4 * 20 / 40)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.5 + 0.5 * 5 / 10)
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0  # in +Inf: the highest finite bound
    assert histogram_quantile(0.95, [(1.0, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.95, []) is None


def api_pod(latencies_s: list[float], traffic_class: str = "interactive", status: int = 200) -> str:
    pod = ApiMetrics(lambda: 0)
    for latency in latencies_s:
        pod.answered(traffic_class, "llmq-sim", status, latency, latency / 2)
    return pod.render().decode()


def router(outcomes: list[wire.Outcome]) -> str:
    m = metrics.RouterMetrics()
    for i, outcome in enumerate(outcomes):
        m.result(
            wire.FinalResult(
                request_id=f"r{i}",
                outcome=outcome,
                model="llmq-sim",
                reply_to=wire.JobReply(batch_id="b", custom_id=str(i)),
                traffic_class="deferred",
            ),
            first=True,
        )
    return m.render().decode()


def test_report_adds_up_pods_and_splits_classes():
    fast = api_pod([0.02] * 95)  # one pod: 95 fast requests
    slow = api_pod([3.0] * 5)  # another: 5 slow ones
    other = api_pod([0.2] * 10, traffic_class="near_interactive", status=504)
    deferred = router([wire.Outcome.SUCCEEDED] * 3 + [wire.Outcome.EXPIRED])
    result = report(Samples([fast, slow, other, deferred]))
    interactive = result["interactive"]
    assert interactive["requests"] == 100
    assert 0.01 <= interactive["latency_p95_s"] <= 0.025  # the 95th request is still a fast one
    assert 2.5 <= interactive["latency_p99_s"] <= 5  # the 99th is a slow one
    assert interactive["ttft_p95_s"] <= 0.025
    near = result["near_interactive"]
    assert near["status_504"] == 10 and near["status_429"] == 0
    assert result["deferred"] == {"finished": 4, "succeeded": 3, "completed_by_deadline_ratio": 0.75}


def test_report_without_data_says_so():
    result = report(Samples([]))
    assert result["interactive"]["latency_p95_s"] is None
    assert result["deferred"]["completed_by_deadline_ratio"] is None

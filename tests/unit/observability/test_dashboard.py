"""deploy/grafana/llmq.json: valid JSON, and every llmq metric its queries name is one the services export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from llmq_api.metrics import ApiMetrics
from llmq_core import metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "llmq.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported_samples() -> set[str]:
    names = set()
    for source in (
        metrics.BatcherMetrics(),
        metrics.WorkerMetrics("m"),
        metrics.RouterMetrics(),
        ApiMetrics(lambda: 0),
    ):
        for family in source.registry.collect():
            names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def queries(panels: list[dict]) -> list[str]:
    out = []
    for panel in panels:
        out += [t["expr"] for t in panel.get("targets", [])]
        out += queries(panel.get("panels", []))
    return out


def test_every_metric_in_the_dashboard_is_exported():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = queries(dashboard["panels"])
    assert len(exprs) >= 20
    used = {name for expr in exprs for name in re.findall(r"\bllmq_[a-z0-9_]+", expr)}
    assert used - exported_samples() == set()
    for needed in (
        "llmq_batcher_oldest_queued_age_seconds",
        "llmq_api_ttft_seconds_bucket",
        "llmq_api_request_latency_seconds_bucket",
        "llmq_kafka_consumer_lag",
        "llmq_tenant_completion_tokens_total",
        "llmq_worker_utilization_ratio",
    ):
        assert needed in used, needed


def test_panels_do_not_overlap():
    cells = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        pos = panel["gridPos"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, panel["title"]
        cells |= area

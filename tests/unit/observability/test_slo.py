"""llmq slo: quantiles from histogram buckets, summed over pods, per traffic class; deferred completion by deadline."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import threading

import pytest
from typer.testing import CliRunner

from llmq_api.metrics import ApiMetrics
from llmq_cli.main import app
from llmq_cli.slo import Samples, histogram_quantile, report, verdicts
from llmq_core import metrics, wire
from llmq_core.settings import SloSettings
from llmq_core.status import ErrorType


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


def router(outcomes: list[wire.Outcome], errors: list[str | None] | None = None) -> str:
    """A result-router's /metrics after deferred results of ``outcomes``, each errored one with an error of the
    type ``errors`` gives in its place (default: a server error)."""
    m = metrics.RouterMetrics()
    for i, outcome in enumerate(outcomes):
        error_type = (errors or [None] * len(outcomes))[i] or ErrorType.SERVER
        m.result(
            wire.FinalResult(
                request_id=f"r{i}",
                outcome=outcome,
                model="llmq-sim",
                reply_to=wire.JobReply(batch_id="b", custom_id=str(i)),
                traffic_class="deferred",
                error=None if outcome is wire.Outcome.SUCCEEDED else wire.ErrorInfo(type=error_type, message="x"),
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
    assert result["deferred"] == {
        "finished": 4,
        "succeeded": 3,
        "client_errors": 0,
        "completed_by_deadline_ratio": 0.75,
    }


def test_lines_errored_for_client_errors_are_left_out_of_completed_by_deadline():
    outcomes = [wire.Outcome.SUCCEEDED] * 9 + [wire.Outcome.ERRORED] * 3 + [wire.Outcome.EXPIRED]
    errors = [None] * 9 + [ErrorType.INVALID_REQUEST, ErrorType.PERMISSION, ErrorType.ENGINE, None]
    deferred = report(Samples([router(outcomes, errors)]))["deferred"]
    assert deferred == {"finished": 11, "succeeded": 9, "client_errors": 2, "completed_by_deadline_ratio": 9 / 11}


def test_verdicts_judge_each_target_that_is_set():
    result = report(Samples([api_pod([0.02] * 99 + [3.0]), router([wire.Outcome.SUCCEEDED] * 99)]))
    targets = SloSettings(interactive_ttft_p95_ms=5, interactive_latency_p99_ms=30_000)
    checks = {(c["class"], c["figure"]): c for c in verdicts(result, targets)}
    assert checks[("interactive", "ttft_p95_ms")]["met"] is False  # TTFT here is latency / 2: 10 ms
    assert checks[("interactive", "ttft_p95_ms")]["value"] > 5
    assert checks[("interactive", "latency_p99_ms")]["met"] is True
    assert checks[("near_interactive", "latency_p99_ms")]["met"] is None  # no near_interactive traffic: no data
    assert checks[("deferred", "completed_by_deadline_ratio")] == {
        "class": "deferred",
        "figure": "completed_by_deadline_ratio",
        "value": 1.0,
        "target": 0.99,
        "met": True,
    }
    assert ("interactive", "latency_p95_ms") not in checks  # 0: no target


def test_report_without_data_says_so():
    result = report(Samples([]))
    assert result["interactive"]["latency_p95_s"] is None
    assert result["deferred"]["completed_by_deadline_ratio"] is None


@contextlib.contextmanager
def serving(text: str):
    """A /metrics URL answering ``text`` (a real HTTP server on a free port, in a thread)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args): ...

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run_slo(monkeypatch, *args: str, env: dict[str, str] | None = None):
    for name in [n for n in os.environ if n.startswith("LLMQ_SLO_")]:
        monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest-xdist's workers have COLUMNS=80: the table would wrap
    return CliRunner().invoke(app, ["slo", *args])


def test_the_exit_code_says_whether_every_target_is_met(monkeypatch):
    with serving(api_pod([0.02] * 100) + router([wire.Outcome.SUCCEEDED] * 98 + [wire.Outcome.EXPIRED] * 2)) as url:
        met = run_slo(monkeypatch, "--url", url, "--target", "deferred_completed_by_deadline_ratio=0.98")
        missed = run_slo(monkeypatch, "--url", url)  # the default target: 0.99
        by_env = run_slo(monkeypatch, "--url", url, "--json", env={"LLMQ_SLO_INTERACTIVE_TTFT_P95_MS": "5"})
    assert met.exit_code == 0, met.output
    assert "MISSED" not in met.output and "completed_by_deadline_ratio" in met.output
    assert missed.exit_code == 1 and "MISSED" in missed.output
    assert by_env.exit_code == 1
    checks = {c["figure"]: c for c in json.loads(by_env.stdout)["targets"] if c["class"] == "interactive"}
    assert checks["ttft_p95_ms"]["target"] == 5 and checks["ttft_p95_ms"]["met"] is False


def test_a_bad_target_or_nothing_to_read_is_not_a_pass(monkeypatch):
    bad = run_slo(monkeypatch, "--url", "http://127.0.0.1:1/metrics", "--target", "interactive_ttft_p96_ms=5")
    assert bad.exit_code == 2 and "interactive_ttft_p96_ms" in bad.output
    negative = run_slo(monkeypatch, "--url", "http://127.0.0.1:1/metrics", "--target", "interactive_ttft_p95_ms=-1")
    assert negative.exit_code == 2 and "interactive_ttft_p95_ms" in negative.output
    unread = run_slo(monkeypatch, "--url", "http://127.0.0.1:1/metrics")
    assert unread.exit_code == 2 and "nothing to judge" in unread.output

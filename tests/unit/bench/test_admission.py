"""llmq_bench.admission.summary: counts, prediction error against the measured latency, admitted percentiles; the pods'
verdicts on their predictions, read from their /metrics."""

from collections import Counter

from llmq_bench.admission import Outcome, prediction_verdicts, summary, verdict_figures


def test_summary_compares_each_admitted_prediction_with_its_latency():
    outcomes = [
        Outcome(200, 1500.0, 1000),
        Outcome(200, 900.0, 1000),
        Outcome(200, 4000.0, 3000),
        Outcome(429, 30.0, None, 6),
        Outcome(429, 80.0, None, 9),
        Outcome(0, 120_000.0),
    ]
    figures = summary(outcomes)
    assert (figures["requests"], figures["admitted"], figures["refused_429"], figures["other"]) == (6, 3, 2, 1)
    assert figures["first_429_ms"] == 30
    assert figures["prediction_abs_error_ms"] == {"p50": 500, "p95": 1000}  # |500|, |-100|, |1000|
    assert figures["prediction_signed_error_p50_ms"] == 500
    assert figures["admitted_latency_ms"] == {"p50": 1500, "p99": 4000, "max": 4000}
    assert figures["retry_after_s"] == {"min": 6, "max": 9}


def test_summary_of_a_run_without_refusals_or_admissions_has_no_figures_instead_of_failing():
    figures = summary([Outcome(200, 10.0, 0)])
    assert figures["first_429_ms"] is None and figures["retry_after_s"] == {"min": None, "max": None}
    assert summary([Outcome(429, 5.0, None, 1)])["admitted_latency_ms"] == {"p50": None, "p99": None, "max": None}


def test_a_streams_wait_after_its_headers_is_compared_with_its_prediction_free_of_the_clients_send_time():
    # Streams get their headers at admission: 8 s after launch (the client was still sending the burst), 3 s of wait.
    outcomes = [
        Outcome(200, 11_000.0, 2500, None, True, 8000.0),
        Outcome(200, 4000.0, 2000, None, True, 1000.0),
        Outcome(200, 9000.0, 1000),
        Outcome(429, 500.0, None, 3),
        Outcome(429, 7000.0, None, 6),
    ]
    figures = summary(outcomes)
    assert figures["streamed_after_admission"] == {
        "count": 2,
        "prediction_abs_error_ms": {"p50": 1000, "p95": 1000},
        "prediction_signed_error_p50_ms": 750,
        "latency_ms": {"p50": 3000, "p99": 3000},
    }
    assert figures["answered_429_ms"] == {"p50": 7000, "max": 7000}


METRICS = """# HELP llmq_api_admission_predictions_total Admitted requests by how their queue wait matched the prediction
# TYPE llmq_api_admission_predictions_total counter
llmq_api_admission_predictions_total{priority_class="interactive:free",region="local",verdict="within"} 40.0
llmq_api_admission_predictions_total{priority_class="interactive:free",region="local",verdict="under"} 3.0
llmq_api_admission_predictions_total{priority_class="interactive:paid",region="local",verdict="within"} 7.0
llmq_api_admission_predictions_created{priority_class="interactive:free",region="local",verdict="within"} 1.7e+09
llmq_api_requests_total{endpoint="completions",outcome="ok",region="local",status="200"} 50.0
"""


def test_the_pods_verdicts_on_their_predictions_are_read_from_metrics_and_counted_between_scrapes():
    after = prediction_verdicts(METRICS)
    assert after == {"within": 47, "under": 3}
    before = Counter({"within": 7})
    assert verdict_figures(before, after) == {"within": 40, "under": 3, "over": 0, "within_share": 0.93}
    assert verdict_figures(after, after)["within_share"] is None  # nothing admitted in between

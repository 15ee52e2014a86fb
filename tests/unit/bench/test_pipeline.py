"""bench.pipeline's pure parts: latency and overhead figures, CPU per request, the floor and the goal ratios."""

from __future__ import annotations

import os

import pytest

from bench import pipeline


def test_overhead_is_end_to_end_minus_engine_time():
    figures = pipeline.latency_figures([10.0, 20.0, 30.0], engine_ms=5)
    assert figures["e2e_p50_ms"] == 20.0 and figures["overhead_p50_ms"] == 15.0
    assert figures["overhead_p99_ms"] == pytest.approx(figures["e2e_p99_ms"] - 5)


def test_cpu_per_request_divides_each_process_by_all_requests():
    cpu = pipeline.cpu_per_request({"kafka": 1.0, "api-0": 2.0}, {"kafka": 1.5, "api-0": 2.1, "batcher": 0.2}, 100)
    assert cpu["per_process_ms"] == {"api-0": pytest.approx(1.0), "batcher": 2.0, "kafka": 5.0}
    assert cpu["total_ms"] == pytest.approx(8.0)


def test_the_floor_is_two_kafka_hops_and_one_redis_hop():
    floor = pipeline.floor_figures([1.0] * 99 + [9.0], [0.2] * 100)
    assert (floor["p50_ms"], floor["kafka_hop_p50_ms"], floor["redis_hop_p50_ms"]) == (2.2, 1.0, 0.2)
    assert floor["p99_ms"] == pytest.approx(2 * floor["kafka_hop_p99_ms"] + 0.2, abs=0.01)


def point(overhead_p50, overhead_p99, cpu_ms, rps):
    return {
        "overhead_p50_ms": overhead_p50,
        "overhead_p99_ms": overhead_p99,
        "cpu": {"total_ms": cpu_ms},
        "throughput_rps": rps,
    }


def test_goals_are_ratios_and_none_where_a_side_is_missing():
    run = {"light": point(6.0, 12.0, 9.0, 30.0), "saturation": point(50.0, 90.0, 2.0, 300.0)}
    baseline = {"light": point(17.0, 30.0, 20.0, 30.0), "saturation": point(500.0, 900.0, 10.0, 100.0)}
    goals = pipeline.goals(run, {"p50_ms": 4.0, "p99_ms": 8.0}, baseline, None)
    assert goals["light_overhead_p50_over_floor"] == 1.5 and goals["light_overhead_p99_over_floor"] == 1.5
    assert goals["saturation_cpu_over_baseline"] == 0.2 and goals["saturation_rps_over_baseline"] == 3.0
    assert goals["saturation_cpu_over_ray"] is None


def test_process_tree_cpu_counts_this_process():
    assert pipeline.process_tree_cpu_s(os.getpid()) > 0
    assert pipeline.process_tree_cpu_s(2**22 + 12345) == 0.0  # no such process


def test_a_profile_summary_shares_samples_by_own_and_inclusive_time():
    raw = (
        "main (/x/app/main.py:3);handle (/x/app/api.py:10);encode (/x/lib/json.py:5) 6\n"
        "main (/x/app/main.py:3);handle (/x/app/api.py:11) 2\n"
        "main (/x/app/main.py:3);poll (/x/lib/sel.py:1) 2\n"
    )
    summary = pipeline.profile_summary(raw)
    assert summary["samples"] == 10
    assert summary["self"][0] == ["encode (json.py)", 0.6]
    assert dict(summary["inclusive"]) == {
        "main (main.py)": 1.0,
        "handle (api.py)": 0.8,
        "encode (json.py)": 0.6,
        "poll (sel.py)": 0.2,
    }

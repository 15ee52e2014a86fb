"""llmq_bench.pipeline's pure parts (latency and overhead figures, CPU per request, the floor and the goal ratios) and its
closed-loop client against a real local server."""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import pytest
from aiohttp import web

from llmq_bench import pipeline
from tests.unit.bench.local_http import refused_url, serve


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


def test_the_machine_is_busy_but_for_idle_and_iowait_ticks():
    before = pipeline.parse_machine_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    after = pipeline.parse_machine_ticks("cpu  250 0 100 850 100 0 0 0 0 0\n")
    assert before == (150, 1000) and after == (350, 1300)
    assert pipeline.busy_fraction(before, after) == pytest.approx(200 / 300, abs=0.001)
    assert pipeline.busy_fraction(after, after) == 0.0
    assert 0 <= pipeline.busy_fraction(before, pipeline.machine_ticks()) <= 1  # this machine's /proc/stat parses


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


async def test_closed_loop_keeps_the_lanes_in_flight_round_robin_and_counts_failures():
    cfg = pipeline.PipelineConfig(max_tokens=3, api_key="k")
    served: Counter[str] = Counter()
    in_flight = most_in_flight = 0

    def pod(name: str):
        async def handler(request: web.Request) -> web.Response:
            nonlocal in_flight, most_in_flight
            assert request.path == "/v1/completions" and request.headers["authorization"] == "Bearer k"
            assert (await request.json())["max_tokens"] == 3
            served[name] += 1
            in_flight += 1
            most_in_flight = max(most_in_flight, in_flight)
            await asyncio.sleep(0)  # let the other lanes in
            in_flight -= 1
            return web.json_response({}, status=500 if sum(served.values()) % 3 == 0 else 200)

        return handler

    async with serve(pod("a")) as a, serve(pod("b")) as b:
        latencies, wall_s, failures = await pipeline.closed_loop([f"{a}/v1", f"{b}/v1"], cfg, 4, 30)
    assert (len(latencies), failures) == (20, 10) and all(0 < ms <= wall_s * 1000 for ms in latencies)
    assert served["a"] > 0 and served["b"] > 0 and most_in_flight <= 4
    _, _, refused = await pipeline.closed_loop([f"{refused_url()}/v1"], cfg, 2, 5)
    assert refused == 5

"""Capacity-curve maths and shaping, and the Ray peer's pure parts (no Ray, no stack)."""

from __future__ import annotations

import pytest

from llmq_bench import capacity_curve as cc
from llmq_bench import loadgen, ray_peer
from llmq_bench.prompts import CodePrompt
from llmq_core.tokenizer import IncrementalDetokenizer


def test_ideal_capacity_is_workers_times_batch_over_batch_time():
    assert cc.ideal_capacity_rps(2, 64, 250) == 512.0
    assert cc.ideal_capacity_rps(2, 16, 2000) == 16.0


@pytest.mark.parametrize("saturation_rps", [25.0, 60.0, 61.3, 400.0])
def test_batch_time_keeps_110_percent_of_ideal_under_half_the_saturation(saturation_rps):
    batch_ms = cc.choose_batch_time_ms(saturation_rps, 2, 16)
    assert 1.1 * cc.ideal_capacity_rps(2, 16, batch_ms) <= 0.5 * saturation_rps
    assert batch_ms % 100 == 0 and batch_ms >= 1000
    if batch_ms > 1000:  # the shortest such time: 100 ms less breaks the bound
        assert 1.1 * cc.ideal_capacity_rps(2, 16, batch_ms - 100) > 0.5 * saturation_rps


def test_batch_time_examples_and_errors():
    assert cc.choose_batch_time_ms(60.0, 2, 16) == 1200  # 2.2 * 32 / 60 = 1.17 s
    assert cc.choose_batch_time_ms(25.0, 2, 64) == 11300
    with pytest.raises(ValueError):
        cc.choose_batch_time_ms(0.0, 2, 16)


def test_ramp_and_keeping_up():
    assert cc.ramp_rates(20, 1.5, 3) == [20, 30, 45]
    assert cc.keeps_up({"throughput_rps": 86, "offered_rps": 100})
    assert not cc.keeps_up({"throughput_rps": 84, "offered_rps": 100})
    # A slow step that still served clearly more than before does not end the ramp; one that served no more does.
    assert cc.ramp_goes_on({"throughput_rps": 30, "offered_rps": 45}, best_rps=20)
    assert not cc.ramp_goes_on({"throughput_rps": 30, "offered_rps": 45}, best_rps=29)
    assert cc.ramp_goes_on({"throughput_rps": 44, "offered_rps": 45}, best_rps=50)


def sample(status: str, e2e_ms: float) -> loadgen.Sample:
    planned = loadgen.Planned(
        at_s=0, prompt="p", max_tokens=1, traffic_class="interactive", api_key="k", stream=False, base_url="u"
    )
    return loadgen.Sample(planned=planned, status=status, e2e_ms=e2e_ms, end_s=1.0)


def test_overhead_subtracts_engine_time_from_successes_only():
    samples = [sample("ok", 1010 + i) for i in range(100)] + [sample("504", 99_999)]
    overhead = cc.overhead_ms(samples, 1000)
    assert overhead["p50"] == 59 and overhead["p99"] == 108


def report(p99_ms: float, goodput_rps: float, fill: float | None) -> dict:
    batches = None if fill is None else {"mean_size": fill * 16, "fill": fill}
    return {
        "offered_rps": 10.0,
        "requests": 250,
        "goodput_rps": goodput_rps,
        "goodput_ratio": goodput_rps / 10,
        "throughput_rps": 9.9,
        "latency_ms": {"p50": p99_ms / 2, "p99": p99_ms},
        "ttft_ms": {"p50": 100.0, "p99": 200.0},
        "batches": batches,
        "rejected_429": 1,
        "timeouts_504": 0,
        "status": {"ok": 249, "429": 1},
        "tenants": {
            "paid": {"requests": 200, "good": 200, "latency_ms": {"p99": p99_ms / 2}, "rejected_429": 0},
            "free": {"requests": 50, "good": 40, "latency_ms": {"p99": p99_ms}, "rejected_429": 1},
        },
    }


def test_point_figures_normalise_by_batch_time():
    point = cc.point_figures(report(3000, 9.0, 0.5), 0.8, 1500)
    assert point["load"] == 0.8 and point["goodput_over_offered"] == 0.9
    assert point["p99_over_batch_time"] == 2.0 and point["batch_fill"] == 0.5 and point["mean_batch_size"] == 8
    assert cc.point_figures(report(3000, 9.0, None), 0.8, 1500)["batch_fill"] == 0.0
    assert point["tenants"]["free"] == {"requests": 50, "goodput_over_offered": 0.8, "p99_ms": 3000, "rejected_429": 1}


def test_compare_gives_llmq_over_ray_ratios_per_point():
    llmq = [cc.point_figures(report(2000, 9.0, 0.5), load, 1000) for load in (0.25, 1.1)]
    ray = [cc.point_figures(report(4000, 6.0, 0.25), 0.25, 1000), cc.point_figures(report(4000, 0.0, 0.0), 1.1, 1000)]
    ratios = cc.compare(llmq, ray)
    assert ratios[0] == {
        "load": 0.25,
        "p99_llmq_over_ray": 0.5,
        "goodput_llmq_over_ray": 1.5,
        "fill_llmq_over_ray": 2.0,
    }
    assert ratios[1]["goodput_llmq_over_ray"] is None and ratios[1]["fill_llmq_over_ray"] is None


def test_peer_replays_the_prompt_like_llmq_sim():
    ids = ray_peer.replay_ids("abc", 5)
    assert IncrementalDetokenizer().push(ids) == "abcab"
    assert ray_peer.replay_ids("", 5) == []


def test_peer_ticks_emit_everything_by_the_last_tick():
    lengths = [5, 64, 0]
    assert ray_peer.tick_targets(lengths, 32, 32) == lengths
    steps = [ray_peer.tick_targets(lengths, 32, t) for t in range(1, 33)]
    assert all(a <= b for prev, cur in zip(steps, steps[1:]) for a, b in zip(prev, cur))


def test_peer_bodies_are_openai_completions():
    body = ray_peer.completion_body("cmpl-1", "llmq-sim", "abcab", 3, 5)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "abcab"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    event = ray_peer.chunk_event("cmpl-1", "llmq-sim", "ab", None)
    assert event.startswith(b"data: {") and event.endswith(b"\n\n")


def test_every_system_gets_the_same_schedule_per_load():
    prompts = [CodePrompt(id=str(i), prompt=f"x = {i}\n", max_tokens=8) for i in range(5)]
    llmq = cc.Runner(cc.CurveConfig(), prompts, ["http://a/v1", "http://b/v1"], None)
    ray = cc.Runner(cc.CurveConfig(), prompts, ["http://r/v1"], None)
    llmq.plans(7.0, 5.0)  # an earlier load must not shift the later ones
    strip = lambda plans: [(p.at_s, p.prompt, p.traffic_class, p.api_key, p.stream) for p in plans]  # noqa: E731
    assert strip(llmq.plans(12.5, 20.0)) == strip(ray.plans(12.5, 20.0))
    assert strip(llmq.plans(12.5, 20.0)) != strip(llmq.plans(13.0, 20.0))

"""The discrete-event simulator and the capacity math of llmq_bench (short runs only)."""

import math

import numpy as np
import pytest

from llmq_bench.capacity import capacity_math, erlang_c, queueing_delay
from llmq_bench.simulate import arrival_counts, parse_mix, run_simulation


def test_light_load_flushes_on_the_window_and_stays_within_window_plus_one_batch():
    result = run_simulation(rps=400, replicas=20, duration_s=2, wait_ms=20, seed=1)
    assert result["completed"] == result["requests"] > 0 and result["expired"] == 0
    assert result["flush"].get("wait", 0) > result["flush"].get("size", 0)
    assert result["mean_batch_fill"] < 0.5
    assert result["latency_ms"]["max"] <= 20 + 250 + 1 + 1  # window + batch + dispatch delay + tick


def test_heavy_load_fills_batches_and_keeps_up():
    result = run_simulation(rps=20_000, replicas=90, duration_s=2, seed=2)
    assert result["expired"] == 0
    assert result["mean_batch_fill"] > 0.95
    assert result["throughput_rps"] == pytest.approx(20_000, rel=0.05)
    assert result["latency_ms"]["p99"] < 300


def test_paid_tier_keeps_its_latency_when_capacity_is_short():
    result = run_simulation(rps=20_000, replicas=70, duration_s=2, paid_share=0.5, seed=3)  # 70 * 256 < 20,000
    tiers = result["latency_ms_by_tier"]
    assert tiers["paid"]["p99"] < 300
    assert tiers["free"]["p99"] > 2 * tiers["paid"]["p99"]


def test_deferred_work_fills_idle_slots_at_40pct_load_without_delaying_interactive_work():
    """Issue 13's run, shortened: 40 req/s on two fixed-time workers of 64 per 500 ms, 5% deferred, 80% paid."""
    run = dict(rps=40, replicas=2, batch_time_ms=500, duration_s=60, paid_share=0.8, seed=4)
    mixed = run_simulation(**run, mix=parse_mix("interactive=0.8,near_interactive=0.15,deferred=0.05"))
    alone = run_simulation(**run, mix=parse_mix("interactive=0.8,near_interactive=0.15"))
    classes = mixed["latency_ms_by_class"]
    assert mixed["completed_by_class"]["deferred"] > 50 and mixed["expired"] == 0
    assert classes["deferred"]["max"] <= 2 * 500 + 20 + 2  # the next batch at the latest, never behind a backlog
    assert mixed["deferred_backlog_max"] <= 5  # read as it arrives
    for key in ("interactive:paid", "interactive:free", "near_interactive"):
        assert classes[key]["p99"] <= 1.1 * alone["latency_ms_by_class"][key]["p99"]


@pytest.mark.parametrize("text", ["interactive=1,bulk=1", "interactive=0", "interactive=-1,deferred=2"])
def test_a_class_mix_names_known_classes_with_positive_shares(text):
    with pytest.raises(ValueError):
        parse_mix(text)


def test_a_class_mix_is_normalised():
    assert parse_mix("interactive=8,deferred=2") == {"interactive": 0.8, "deferred": 0.2}


def test_bursty_arrivals_keep_the_mean_rate():
    counts = arrival_counts(10_000, 20, 1, "bursty", np.random.default_rng(0), burst_factor=4)
    assert counts.sum() / 20 == pytest.approx(10_000, rel=0.02)
    assert counts[:1000].mean() > 2 * counts[5000:6000].mean()  # first 20% of each 10 s period is the burst


def test_capacity_math_of_seed_003():
    plan = capacity_math(rps=40_000, max_batch=64, batch_time_ms=250, headroom=0.3, spare_replicas=1)
    assert (plan["per_replica_rps_full_batches"], plan["per_replica_rps_half_batches"]) == (256, 128)
    assert (plan["replicas_at_100pct_full_batches"], plan["replicas_at_100pct_half_batches"]) == (157, 313)
    assert plan["replicas_planned"] == math.ceil(40_000 / (256 * 0.7)) + 1
    assert plan["p99_latency_bound_ms"] < 600


@pytest.mark.parametrize("servers, load, expected", [(1, 0.5, 0.5), (2, 1.0, 1 / 3), (3, 3.0, 1.0)])
def test_erlang_c(servers, load, expected):
    assert erlang_c(servers, load) == pytest.approx(expected)


def test_queueing_delay_grows_toward_saturation_and_is_infinite_past_it():
    delays = [queueing_delay(40_000, r, 64, 250)["mean_ms"] for r in (158, 165, 200)]
    assert delays[0] > delays[1] > delays[2] >= 0
    assert queueing_delay(40_000, 150, 64, 250)["mean_ms"] == math.inf


def test_several_batchers_share_the_arrivals_and_each_request_ends_once():
    result = run_simulation(rps=380, replicas=2, batch_time_ms=500, duration_s=5, paid_share=0.5, batchers=3, seed=7)
    alone = run_simulation(rps=380, replicas=2, batch_time_ms=500, duration_s=5, paid_share=0.5, seed=7)
    assert result["requests"] == alone["requests"] == result["completed"] + result["expired"]
    assert sum(result["completed_by_class"].values()) == result["completed"]


def test_batches_of_several_batchers_meet_in_a_workers_queue():
    """The mechanism issue 28 measured on the real stack: each batcher sends a worker it sees free a full batch, so with
    three of them batches wait in the worker's queue (one batcher's never do) and paid work waits longer."""
    run = dict(rps=380, replicas=2, batch_time_ms=500, duration_s=10, paid_share=0.5, seed=7)
    one, three = run_simulation(**run), run_simulation(**run, batchers=3)
    assert one["wait_ms_by_stage"]["worker"]["p99"] <= 2  # the dispatch delay and a tick
    assert three["wait_ms_by_stage"]["worker"]["p50"] >= 500  # a batch time behind another batcher's batch
    assert three["latency_ms_by_tier"]["paid"]["p99"] > 1.5 * one["latency_ms_by_tier"]["paid"]["p99"]


def test_with_the_shared_ledger_and_class_leads_three_batchers_schedule_as_one():
    """Issue 28's lever on paper: batches of each class go ahead of a worker's window in precedence, the ledger hands
    each window out once, so the windows fill with paid work from every batcher before free work."""
    run = dict(rps=380, replicas=2, batch_time_ms=500, duration_s=10, paid_share=0.5, seed=7)
    one = run_simulation(**run)
    three = run_simulation(**run, batchers=3, shared_capacity=True, leads_ms=(40, 30, 20, 10))
    assert three["latency_ms_by_tier"]["paid"]["p99"] <= 1.1 * one["latency_ms_by_tier"]["paid"]["p99"]
    assert three["mean_window_fill"] >= 0.95 * one["mean_window_fill"]
    assert three["wait_ms_by_stage"]["worker"]["max"] <= 40 + 1  # the lead, never a window behind another batch

"""The batch-time model with a prefill term (llmq_bench.batch_time) in the capacity math and the simulator (issue 31,
item 4): fixed time stays the default; prefill per uncached prompt token, a prefix-cache hit saving the header."""

import math

import pytest

from llmq_bench.batch_time import DEFAULT_PREFILL_MS_PER_TOKEN, BatchTimeModel
from llmq_bench.capacity import capacity_math, max_batch_within
from llmq_bench.simulate import run_simulation

SEED_003 = dict(rps=40_000, max_batch=64, batch_time_ms=250, headroom=0.3, spare_replicas=1)


def test_the_default_prefill_figure_is_its_stated_derivation():
    assert DEFAULT_PREFILL_MS_PER_TOKEN == pytest.approx(2 * 7e9 / (989.5e12 * 0.5) * 1000, abs=1e-4)


def test_without_prompt_tokens_a_batch_takes_its_fixed_time_whatever_it_holds():
    model = BatchTimeModel(fixed_ms=250)
    assert model.fixed
    assert model.batch_ms(0) == model.batch_ms(100_000) == 250
    assert model.describe() == {"fixed_ms": 250, "mode": "fixed"}


def test_prefill_adds_time_per_uncached_token_and_a_hit_saves_the_header():
    model = BatchTimeModel(
        fixed_ms=250, prefill_ms_per_token=0.03, prompt_tokens=2000, prefix_tokens=1500, prefix_hit_rate=0.6
    )
    assert (model.uncached_tokens(hit=False), model.uncached_tokens(hit=True)) == (2000, 500)
    assert model.mean_uncached_tokens == 2000 - 0.6 * 1500
    assert model.batch_ms(1000) == pytest.approx(250 + 30)
    assert model.expected_batch_ms(64) == pytest.approx(250 + 0.03 * 64 * 1100)
    assert model.describe()["prefill_source"] == "given"


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"fixed_ms": 0}, "batch time must be > 0"),
        ({"prefill_ms_per_token": -1}, "--prefill-ms-per-token must be >= 0"),
        ({"prompt_tokens": -5}, "must be >= 0"),
        ({"prompt_tokens": 100, "prefix_tokens": 101}, "at most --prompt-tokens"),
        ({"prompt_tokens": 100, "prefix_tokens": 50, "prefix_hit_rate": 1.5}, "a share, 0..1"),
        ({"prompt_tokens": 100, "prefix_hit_rate": 0.5}, "needs --prefix-tokens"),
    ],
)
def test_settings_that_make_no_model_are_refused_naming_the_flag(fields, problem):
    with pytest.raises(ValueError, match=problem):
        BatchTimeModel(**fields)


def test_the_fixed_model_given_plans_as_the_fixed_batch_time():
    assert capacity_math(**SEED_003, batch_time=BatchTimeModel(fixed_ms=250)) == capacity_math(**SEED_003)


def test_a_prefix_hit_rate_cuts_the_replicas_by_the_prefill_it_saves():
    cold = BatchTimeModel(prefill_ms_per_token=0.03, prompt_tokens=2000)
    warm = BatchTimeModel(prefill_ms_per_token=0.03, prompt_tokens=2000, prefix_tokens=1500, prefix_hit_rate=0.6)
    plans = [capacity_math(**SEED_003, batch_time=model) for model in (cold, warm)]
    for plan, uncached in zip(plans, (2000, 1100), strict=True):
        full_ms = 250 + 0.03 * 64 * uncached
        assert plan["batch_time_ms_full_batch"] == pytest.approx(full_ms)
        assert plan["per_replica_rps_full_batches"] == pytest.approx(64_000 / full_ms)
        assert plan["per_replica_rps_half_batches"] == pytest.approx(32_000 / (250 + 0.03 * 32 * uncached))
        assert plan["replicas_at_100pct_full_batches"] == math.ceil(40_000 * full_ms / 64_000)
    assert plans[1]["replicas_planned"] < 0.6 * plans[0]["replicas_planned"]


def test_the_largest_batch_within_the_target_leaves_room_for_the_fixed_part():
    prefill = BatchTimeModel(prefill_ms_per_token=0.03, prompt_tokens=2000)  # 250 ms + 60 ms per request
    assert max_batch_within(prefill, 64, 580) == 5
    assert max_batch_within(prefill, 4, 580) == 4
    assert max_batch_within(prefill, 64, 300) == 0  # one request takes 310 ms
    assert max_batch_within(BatchTimeModel(), 64, 580) == 64
    assert max_batch_within(BatchTimeModel(), 64, 200) == 0


@pytest.mark.parametrize(
    "fields, problem",
    [({"rps": 0}, "peak > 0"), ({"max_batch": 0}, "batches of >= 1"), ({"headroom": 1.0}, "0 <= h < 1")],
)
def test_capacity_math_refuses_input_that_makes_no_plan(fields, problem):
    with pytest.raises(ValueError, match=problem):
        capacity_math(**(SEED_003 | fields))


def test_simulated_windows_take_the_prefill_of_their_requests():
    """A window takes 250 ms + 0.01 ms x its requests' uncached tokens: 500 each with every header cached (so the mean
    window follows its mean fill exactly, to the ms each window is rounded to), 1,250 on average at half the hits."""
    run = dict(rps=2_000, replicas=40, max_batch=64, duration_s=3, seed=5)
    fields = dict(prefill_ms_per_token=0.01, prompt_tokens=2000, prefix_tokens=1500)
    hit = run_simulation(**run, batch_time=BatchTimeModel(**fields, prefix_hit_rate=1.0))
    half = run_simulation(**run, batch_time=BatchTimeModel(**fields, prefix_hit_rate=0.5))
    assert hit["expired"] == half["expired"] == 0
    window_ms = [250 + 0.01 * hit["mean_window_fill"] * 64 * 500, 250 + 0.01 * half["mean_window_fill"] * 64 * 1250]
    assert hit["mean_window_ms"] == pytest.approx(window_ms[0], abs=2)
    assert half["mean_window_ms"] == pytest.approx(window_ms[1], rel=0.05)  # hits drawn per request
    assert half["latency_ms"]["p99"] > hit["latency_ms"]["p99"]


def test_the_fixed_time_simulation_is_unchanged_by_a_fixed_model():
    run = dict(rps=400, replicas=20, duration_s=2, seed=1)
    alone, given = run_simulation(**run), run_simulation(**run, batch_time=BatchTimeModel(fixed_ms=250))
    assert {k: v for k, v in alone.items() if k not in ("wall_s", "sim_speed")} == {
        k: v for k, v in given.items() if k not in ("wall_s", "sim_speed")
    }
    assert alone["mean_window_ms"] == 250

"""saturation.py and policy.model_states: the per-model admission signals the batcher publishes for API pods."""

import math

import pytest

from llmq_batcher.policy import BatchDispatch
from llmq_batcher.saturation import BacklogDrain, DrainMeter, saturation_report
from llmq_core import wire
from llmq_core.models import BUILTIN_MODELS
from tests.unit.batcher.helpers import MODEL, T0, hb, make_policy, req

TINY = "llmq-tiny"


def test_report_carries_each_models_queues_workers_and_last_heartbeat_but_no_made_up_model():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1", free=0, max_slots=8), clock.now_ms())  # busy: llmq-sim's paid request stays queued
    policy.add(req("sim-paid", "paid"), clock.now_ms())
    policy.add(req("tiny-deferred", "deferred", model=TINY), clock.now_ms())
    clock.advance(300)
    policy.add(req("tiny-free", "free", model=TINY, now_ms=clock.now_ms()), clock.now_ms())
    for i in range(50):
        policy.add(req(f"junk-{i}", "paid", model=f"made-up-{i}", now_ms=clock.now_ms()), clock.now_ms())
    clock.advance(700)
    now_ms = clock.now_ms()
    decision = policy.schedule(now_ms)
    drain = {MODEL: {"interactive:paid": 2.5}, TINY: {}}
    backlog = {MODEL: {"interactive:paid": 40.0}}
    report = saturation_report(
        "b-1", T0 - 5, now_ms, decision.load, policy.model_states(now_ms), BUILTIN_MODELS, drain, backlog
    )

    assert (report.batcher_id, report.sent_ms, report.started_ms) == ("b-1", T0 + 1000, T0 - 5)
    assert set(report.models) == {MODEL, TINY}
    sim, tiny = report.models[MODEL], report.models[TINY]
    assert (sim.workers, sim.slots, sim.worker_seen_ms) == (1, 8, T0)
    assert sim.capacity_per_s == 8.0  # 8 slots, no drain estimate: the assumed 1 s service time
    assert sim.classes["interactive:paid"] == wire.QueueLoad(
        depth=1, oldest_age_ms=1000, drained_per_s=2.5, backlog_drained_per_s=40.0
    )
    assert (tiny.workers, tiny.slots, tiny.worker_seen_ms) == (0, 0, 0)
    assert [(tiny.classes[c].depth, tiny.classes[c].oldest_age_ms) for c in ("interactive:free", "deferred")] == [
        (1, 700),
        (1, 1000),
    ]
    assert report.classes["interactive:paid"].depth == 51  # every model's requests, made-up ones too
    assert report.classes["interactive:paid"].drained_per_s == 2.5


def test_a_gone_workers_model_keeps_its_last_heartbeat_time_and_a_new_model_with_a_worker_is_reported():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1"), clock.now_ms())
    policy.on_heartbeat(
        hb("w2", model="my-llama"), clock.now_ms()
    )  # served by a --model-path worker: reported while it has one
    clock.advance(2500)
    policy.schedule(clock.now_ms())  # both workers are past the heartbeat timeout: gone
    states = policy.model_states(clock.now_ms())
    assert [(states[m].workers, states[m].worker_seen_ms) for m in (MODEL, "my-llama")] == [(0, T0), (0, T0)]
    report = saturation_report("b", T0, clock.now_ms(), {}, states, BUILTIN_MODELS, {}, {})
    assert set(report.models) == {MODEL, "my-llama"}


def batch(model: str, *classes: str) -> BatchDispatch:
    requests = [req(f"r{i}", cls, model=model) for i, cls in enumerate(classes)]
    return BatchDispatch("b", "w1", 1, model, requests, "size", T0)


def test_drain_rate_per_model_and_class_follows_dispatches_and_decays():
    meter = DrainMeter(T0, tau_ms=5000)
    meter.dispatched([batch(MODEL, "paid", "paid", "deferred"), batch(TINY, "free")])
    rates = meter.rates(T0 + 1000)  # one interval: 2 paid/s seen, smoothed by 1 - e^(-1/5)
    alpha = 1 - math.exp(-0.2)
    assert rates[MODEL]["interactive:paid"] == pytest.approx(2 * alpha)
    assert rates[MODEL]["deferred"] == pytest.approx(alpha) and rates[TINY]["interactive:free"] == pytest.approx(alpha)
    assert meter.rates(T0 + 1000) == rates  # no time passed: unchanged
    for second in range(2, 60):  # a steady 2 paid/s converges to 2; what stopped fades out and is forgotten
        meter.dispatched([batch(MODEL, "paid", "paid")])
        rates = meter.rates(T0 + second * 1000)
    assert rates == {MODEL: {"interactive:paid": pytest.approx(2, rel=1e-3)}}


# (engine's heartbeat) -> requests/s its slots promise
CAPACITY = [
    pytest.param(dict(max_slots=64, fixed_ms=500), 128.0, id="fixed-time-64-per-500ms"),
    pytest.param(dict(max_slots=8, est_drain_ms=4000, free=0), 2.0, id="continuous-with-drain-estimate"),
    pytest.param(dict(max_slots=8, est_drain_ms=200, free=0), 8.0, id="continuous-estimate-below-assumed-1s"),
]


@pytest.mark.parametrize("heartbeat,per_s", CAPACITY)
def test_capacity_from_heartbeats_is_slots_per_batch_time(heartbeat, per_s):
    policy, clock = make_policy()
    policy.on_heartbeat(hb("w1", **heartbeat), clock.now_ms())
    policy.on_heartbeat(hb("w2", **heartbeat), clock.now_ms())
    assert policy.model_states(clock.now_ms())[MODEL].capacity_per_s == pytest.approx(2 * per_s)


def state(slots: int = 8, **loads: tuple[int, int]) -> dict[str, wire.ModelLoad]:
    """class=(depth, oldest queued age ms) of MODEL, whose live workers have ``slots``."""
    classes = {
        k.replace("_paid", ":paid").replace("_free", ":free"): wire.QueueLoad(depth=d, oldest_age_ms=age)
        for k, (d, age) in loads.items()
    }
    return {MODEL: wire.ModelLoad(classes=classes, workers=1 if slots else 0, slots=slots, worker_seen_ms=T0)}


def test_backlog_drain_rate_is_measured_only_while_work_waits_and_covers_the_classes_above():
    meter = BacklogDrain(T0)
    meter.dispatched([batch(MODEL, *["paid"] * 3)])
    assert meter.rates(T0 + 1000, state(interactive_paid=(0, 0))) == {}  # room to spare: an arrival rate
    assert meter.rates(T0 + 2000, state(interactive_paid=(50, 300), deferred=(7, 900))) == {}  # waiting since lately
    meter.dispatched([batch(MODEL, *["paid"] * 30, *["free"] * 10)])
    rates = meter.rates(T0 + 3000, state(interactive_paid=(50, 1300), deferred=(7, 1900)))[MODEL]
    # paid waited throughout: 30 paid/s; free and near drain behind paid: 40/s; deferred too (nothing of it went out)
    assert rates == {"interactive:paid": 30.0, "interactive:free": 40.0, "near_interactive": 40.0, "deferred": 40.0}
    meter.dispatched([batch(MODEL, *["paid"] * 10)])
    rates = meter.rates(T0 + 4000, state(interactive_paid=(15, 2300)))[MODEL]
    keep = math.exp(-1 / 20)  # requests over seconds of backlog, the older forgotten over 20 s of it
    assert rates["interactive:paid"] == pytest.approx((30 * keep + 10) / (keep + 1))
    assert rates["deferred"] == pytest.approx((40 * keep + 10) / (keep + 1))  # paid above it still waited
    assert meter.rates(T0 + 60_000, state())[MODEL] == rates  # no backlog: the last measured rates stand
    assert meter.rates(T0 + 660_000, state())[MODEL] == rates  # after 10 min idle too


def test_a_fixed_time_fleets_windows_average_out_over_the_backlog():
    # 64 requests per 500 ms window: a 1 s interval holds 2 windows or 3 (as they fall), the rate is 128/s
    meter = BacklogDrain(T0)
    for second, windows in enumerate([3, 2, 2, 1, 2, 3, 2, 2, 1, 2], start=1):
        meter.dispatched([batch(MODEL, *["paid"] * 64 * windows)])
        rates = meter.rates(T0 + second * 1000, state(interactive_paid=(1000, 5000)))
        if second == 1:
            assert rates[MODEL]["interactive:paid"] == 192.0  # one interval: a window off
    assert rates[MODEL]["interactive:paid"] == pytest.approx(128, rel=0.03)


def test_a_backlogs_last_interval_and_a_short_one_measure_nothing():
    meter = BacklogDrain(T0)
    meter.rates(T0 + 1000, state(interactive_paid=(100, 900)))
    meter.dispatched([batch(MODEL, *["paid"] * 40)])
    # the backlog's end: fewer wait than went out (this batcher may have had the workers while the others ran dry)
    assert meter.rates(T0 + 2000, state(interactive_paid=(39, 1900))) == {}
    meter.dispatched([batch(MODEL, *["paid"] * 8)])
    assert meter.rates(T0 + 2010, state(interactive_paid=(60, 2910))) == {}  # 10 ms: no batch, or one, is no rate
    meter.dispatched([batch(MODEL, *["paid"] * 32)])
    assert meter.rates(T0 + 3000, state(interactive_paid=(60, 2900)))[MODEL]["interactive:paid"] == 40.0  # 1 s


def test_a_queue_never_empty_at_a_report_but_never_waiting_a_whole_interval_is_no_backlog():
    # Light load on a fixed-time worker: each report finds a few requests waiting for its next 500 ms window, and 20/s
    # go out (the arrival rate, far below what the workers drain a backlog at): no rate is measured from that.
    meter = BacklogDrain(T0)
    for second in range(1, 30):
        meter.dispatched([batch(MODEL, *["free"] * 20)])
        assert meter.rates(T0 + second * 1000, state(interactive_free=(3, 450))) == {}


def test_the_backlog_rate_follows_the_slots_live_now():
    meter = BacklogDrain(T0)
    meter.rates(T0 + 1000, state(interactive_paid=(80, 500)))
    meter.dispatched([batch(MODEL, *["paid"] * 40)])
    assert meter.rates(T0 + 2000, state(interactive_paid=(60, 1500)))[MODEL]["interactive:paid"] == 40.0  # 8 slots
    assert meter.rates(T0 + 3000, state(slots=16))[MODEL]["interactive:paid"] == 80.0  # a second worker joined
    assert meter.rates(T0 + 4000, state(slots=4))[MODEL]["interactive:paid"] == 20.0  # half the slots left
    assert meter.rates(T0 + 5000, state(slots=0)) == {}  # no worker: nothing drains
    assert meter.rates(T0 + 6000, state(slots=8))[MODEL]["interactive:paid"] == 40.0  # back: the rate per slot stands

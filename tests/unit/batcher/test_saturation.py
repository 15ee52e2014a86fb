"""saturation.py and policy.model_states: the per-model admission signals the batcher publishes for API pods."""

import math

import pytest

from llmq_core import wire
from llmq_core.models import BUILTIN_MODELS
from llmq_batcher.policy import BatchDispatch
from llmq_batcher.saturation import DrainMeter, saturation_report
from tests.unit.batcher.helpers import MODEL, T0, hb, make_policy, req

TINY = "llmq-tiny"


def test_report_carries_each_models_queues_workers_and_last_heartbeat_but_no_made_up_model():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1", free=0, max_slots=8))  # busy: llmq-sim's paid request stays queued
    policy.add(req("sim-paid", "paid"))
    policy.add(req("tiny-deferred", "deferred", model=TINY))
    clock.advance(300)
    policy.add(req("tiny-free", "free", model=TINY, now_ms=clock.now_ms()))
    for i in range(50):
        policy.add(req(f"junk-{i}", "paid", model=f"made-up-{i}", now_ms=clock.now_ms()))
    clock.advance(700)
    now_ms = clock.now_ms()
    decision = policy.schedule(now_ms)
    drain = {MODEL: {"interactive:paid": 2.5}, TINY: {}}
    report = saturation_report("b-1", T0 - 5, now_ms, decision.load, policy.model_states(now_ms), BUILTIN_MODELS,
                               drain)

    assert (report.batcher_id, report.sent_ms, report.started_ms) == ("b-1", T0 + 1000, T0 - 5)
    assert set(report.models) == {MODEL, TINY}
    sim, tiny = report.models[MODEL], report.models[TINY]
    assert (sim.workers, sim.slots, sim.worker_seen_ms) == (1, 8, T0)
    assert sim.classes["interactive:paid"] == wire.QueueLoad(depth=1, oldest_age_ms=1000, drained_per_s=2.5)
    assert (tiny.workers, tiny.slots, tiny.worker_seen_ms) == (0, 0, 0)
    assert [(tiny.classes[c].depth, tiny.classes[c].oldest_age_ms) for c in ("interactive:free", "deferred")] == [
        (1, 700), (1, 1000)]
    assert report.classes["interactive:paid"].depth == 51  # every model's requests, made-up ones too
    assert report.classes["interactive:paid"].drained_per_s == 2.5


def test_a_gone_workers_model_keeps_its_last_heartbeat_time_and_a_new_model_with_a_worker_is_reported():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1"))
    policy.on_heartbeat(hb("w2", model="my-llama"))  # served by a --model-path worker: reported while it has one
    clock.advance(2500)
    policy.schedule(clock.now_ms())  # both workers are past the heartbeat timeout: gone
    states = policy.model_states(clock.now_ms())
    assert [(states[m].workers, states[m].worker_seen_ms) for m in (MODEL, "my-llama")] == [(0, T0), (0, T0)]
    report = saturation_report("b", T0, clock.now_ms(), {}, states, BUILTIN_MODELS, {})
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

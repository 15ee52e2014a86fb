"""admission.py: merged batcher reports per model, the shed rules, Retry-After from the predicted wait, lowest class
first, one model's backlog never shedding another's traffic, and 503 for a model whose workers are gone."""

import pytest
from hypothesis import given, settings, strategies as st

from llmq_core import wire
from llmq_core.constants import PRIORITY_CLASSES
from llmq_core.settings import Settings
from llmq_api.admission import IDLE, Queues, Saturation, ShedPolicy, merge_reports, retry_after_s

PAID, FREE, NEAR, DEFERRED = PRIORITY_CLASSES
SIM, TINY = "llmq-sim", "llmq-tiny"
NOW = 1_000_000
POLICY = ShedPolicy.from_settings(Settings(api_max_in_flight=100, batcher_max_queued=1000,
                                           worker_heartbeat_timeout_ms=2000))


def classes(**loads: tuple[int, int]) -> dict[str, wire.QueueLoad]:
    return {key.replace("_paid", ":paid").replace("_free", ":free"): wire.QueueLoad(depth=d, oldest_age_ms=a)
            for key, (d, a) in loads.items()}


def model(workers: int = 1, seen_ms: int = NOW, **loads: tuple[int, int]) -> wire.ModelLoad:
    return wire.ModelLoad(classes=classes(**loads), workers=workers, slots=8 * workers, worker_seen_ms=seen_ms)


def report(batcher_id: str, sent_ms: int, started_ms: int = 1, **models: wire.ModelLoad) -> wire.BatcherSaturation:
    return wire.BatcherSaturation(batcher_id=batcher_id, sent_ms=sent_ms, started_ms=started_ms,
                                  models={name.replace("_", "-"): load for name, load in models.items()})


def saturation(models: dict[str, Queues], workers: dict[str, int] | None = None) -> Saturation:
    """Queues per model; every model has a live worker unless ``workers`` says otherwise."""
    return Saturation(models, workers if workers is not None else {m: 1 for m in (SIM, TINY)}, {}, 0, NOW)


def test_reports_merge_fresh_ones_per_model_and_age_them():
    reports = [report("b1", 10_000, llmq_sim=model(interactive_paid=(3, 400), deferred=(10, 9000))),
               report("b2", 9_000, llmq_sim=model(interactive_paid=(2, 100)), llmq_tiny=model(near_interactive=(4, 50))),
               report("b3", 1_000, llmq_sim=model(interactive_paid=(50, 60_000)))]  # stale: ignored
    merged = merge_reports(reports, now_ms=10_500, stale_ms=5000)
    assert merged.queues[SIM] == Queues({PAID: 5, DEFERRED: 10}, {PAID: 1600, DEFERRED: 9500})  # b2's 100 ms + 1.5 s
    assert merged.ahead(SIM, PAID) == (5, 1600) and merged.ahead(SIM, DEFERRED) == (15, 9500)
    assert merged.ahead(TINY, DEFERRED) == (4, 1550) and merged.ahead(TINY, FREE) == (0, 0)
    assert merged.ahead("never-reported", DEFERRED) == (0, 0) and IDLE.ahead(SIM, DEFERRED) == (0, 0)


def test_idle_system_admits_everyone():
    assert all(POLICY.check(c, m, IDLE, in_flight=0) is None for c in PRIORITY_CLASSES for m in (SIM, TINY))


def test_predicted_wait_sheds_the_classes_behind_it_with_retry_after():
    sat = saturation({SIM: Queues({FREE: 4}, {FREE: 6_200})})  # over free's 5 s: free and everything below
    assert POLICY.check(PAID, SIM, sat, 0) is None
    for cls in (FREE, NEAR, DEFERRED):
        rejection = POLICY.check(cls, SIM, sat, 0)
        assert rejection.reason == "queue_wait"
        error = rejection.error
        assert (error.status, error.code, error.type) == (429, "rate_limit_exceeded", "rate_limit_error")
        assert error.headers == {"retry-after": "7"}
    near_only = saturation({SIM: Queues({NEAR: 1}, {NEAR: 2_500})})
    assert [POLICY.check(c, SIM, near_only, 0) is None for c in PRIORITY_CLASSES] == [True, True, False, False]


def test_queue_depth_and_pod_in_flight_shares():
    deep = saturation({SIM: Queues({PAID: 600}, {PAID: 10})})  # 600 of 1000 queued: over deferred's 0.5 only
    assert [POLICY.check(c, SIM, deep, 0) is None for c in PRIORITY_CLASSES] == [True, True, True, False]
    assert POLICY.check(DEFERRED, SIM, deep, 0).reason == "queue_depth"
    assert [POLICY.check(c, SIM, IDLE, 72) is None for c in PRIORITY_CLASSES] == [True, True, False, False]
    assert POLICY.check(NEAR, SIM, IDLE, 72).reason == "pod_in_flight"
    assert POLICY.check(NEAR, SIM, IDLE, 72).error.headers == {"retry-after": "1"}
    assert POLICY.check(PAID, SIM, IDLE, 95) is not None


# One model's backlog, however old or deep, against every class of the other model: nothing of the other is shed.
BACKLOGS = [
    pytest.param(Queues({c: 900 for c in PRIORITY_CLASSES}, {c: 600_000 for c in PRIORITY_CLASSES}), id="old-and-deep"),
    pytest.param(Queues({PAID: 1}, {PAID: 16_000}), id="paid-past-15s"),
    pytest.param(Queues({FREE: 1}, {FREE: 5_001}), id="free-past-5s"),
    pytest.param(Queues({DEFERRED: 999}, {DEFERRED: 86_400_000}), id="deferred-day-old"),
]


@pytest.mark.parametrize("backlog", BACKLOGS)
@pytest.mark.parametrize("workers", [{TINY: 1, SIM: 1}, {SIM: 1}], ids=["tiny-has-workers", "tiny-has-none"])
def test_one_models_backlog_never_sheds_another_models_traffic(backlog, workers):
    sat = Saturation({TINY: backlog}, workers, {SIM: NOW, TINY: NOW - 1000}, 0, NOW)
    assert [POLICY.check(c, SIM, sat, 0) for c in PRIORITY_CLASSES] == [None] * 4
    assert POLICY.check(DEFERRED, TINY, sat, 0) is not None  # the backlog does shed its own model's lowest class


# (live workers, last worker heartbeat, batchers watching since) -> tiny's interactive, near, deferred admitted?
AVAILABILITY = [
    pytest.param(1, NOW - 60_000, 0, (True, True, True), id="a-live-worker"),
    pytest.param(0, NOW - 1_900, 0, (True, True, True), id="gone-within-the-timeout"),
    pytest.param(0, NOW - 2_001, 0, (False, False, True), id="gone-past-the-timeout"),
    pytest.param(0, 0, NOW - 1_000, (True, True, True), id="never-seen-batcher-just-started"),
    pytest.param(0, 0, NOW - 2_001, (False, False, True), id="never-seen-past-the-timeout"),
]


@pytest.mark.parametrize("workers,seen_ms,since_ms,admitted", AVAILABILITY)
def test_a_model_whose_workers_are_gone_answers_people_503_and_queues_deferred(workers, seen_ms, since_ms, admitted):
    sat = Saturation({}, {TINY: workers, SIM: 1}, {TINY: seen_ms} if seen_ms else {}, since_ms, NOW)
    results = [POLICY.check(c, TINY, sat, 0) for c in (PAID, FREE, NEAR, DEFERRED)]
    assert [r is None for r in results] == [admitted[0], admitted[0], admitted[1], admitted[2]]
    for rejection in filter(None, results):
        error = rejection.error
        assert rejection.reason == "model_unavailable"
        assert (error.status, error.code, error.param, error.headers) == (503, "model_unavailable", "model",
                                                                           {"retry-after": "2"})
    assert all(POLICY.check(c, SIM, sat, 0) is None for c in PRIORITY_CLASSES)


def test_deferred_work_of_a_gone_model_waits_for_workers_but_its_queue_stays_bounded():
    old = Saturation({TINY: Queues({DEFERRED: 10}, {DEFERRED: 3_600_000})}, {}, {}, NOW - 10_000, NOW)
    assert POLICY.check(DEFERRED, TINY, old, 0) is None  # an hour old: the autoscaler's signal, not a reason to shed
    full = Saturation({TINY: Queues({DEFERRED: 500}, {DEFERRED: 1})}, {}, {}, NOW - 10_000, NOW)
    assert POLICY.check(DEFERRED, TINY, full, 0).reason == "queue_depth"


def test_without_fresh_reports_nothing_is_known_and_nobody_gets_503():
    stale = merge_reports([report("b", NOW - 6000, llmq_tiny=model(workers=0, seen_ms=1))], NOW, stale_ms=5000)
    assert stale.worker_gone_ms(TINY) is None and POLICY.check(PAID, TINY, stale, 0) is None


def test_merged_availability_takes_the_best_view_of_any_batcher():
    reports = [report("old", NOW - 500, started_ms=NOW - 60_000, llmq_sim=model(workers=2, seen_ms=NOW - 600)),
               report("new", NOW - 100, started_ms=NOW - 1_000, llmq_sim=model(workers=0, seen_ms=0),
                      llmq_tiny=model(workers=0, seen_ms=NOW - 9_000))]
    merged = merge_reports(reports, NOW, stale_ms=5000)
    assert merged.workers == {SIM: 2, TINY: 0} and merged.watching_since_ms == NOW - 60_000
    assert merged.worker_gone_ms(SIM) is None
    assert merged.worker_gone_ms(TINY) == 9_000
    assert merged.worker_gone_ms("llmq-other") == 60_000  # in the catalogue, never seen by anyone


def test_retry_after_is_whole_seconds_within_bounds():
    assert [retry_after_s(ms) for ms in (0, 1, 1000, 1001, 59_500, 10**9)] == [1, 1, 1, 2, 60, 60]


loads = st.tuples(st.integers(0, 2000), st.integers(0, 30_000))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(PRIORITY_CLASSES), loads), st.integers(0, 120))
def test_a_shed_class_means_every_lower_class_is_shed(classes, in_flight):
    sat = saturation({SIM: Queues({c: d for c, (d, _) in classes.items()},
                                  {c: a for c, (d, a) in classes.items() if d})})
    admitted = [POLICY.check(c, SIM, sat, in_flight) is None for c in PRIORITY_CLASSES]
    assert admitted == sorted(admitted, reverse=True)  # admitted classes form a prefix: highest first


def test_a_worker_heartbeat_the_pod_heard_itself_counts_before_the_batchers_report_it():
    reports = [report("b", NOW - 200, started_ms=NOW - 60_000, llmq_tiny=model(workers=0, seen_ms=0))]
    unheard = merge_reports(reports, NOW, stale_ms=5000)
    assert POLICY.check(PAID, TINY, unheard, 0).reason == "model_unavailable"
    heard = merge_reports(reports, NOW, stale_ms=5000, heard_ms={TINY: NOW - 300})  # a worker that just started
    assert heard.worker_gone_ms(TINY) == 300 and POLICY.check(PAID, TINY, heard, 0) is None
    long_ago = merge_reports(reports, NOW, stale_ms=5000, heard_ms={TINY: NOW - 30_000})
    assert POLICY.check(PAID, TINY, long_ago, 0).reason == "model_unavailable"

"""admission.py: merged batcher reports per model, the wait predicted from the work queued ahead over its drain rate,
the shed rules, Retry-After from the predicted wait, lowest class first, one model's backlog never shedding another's
traffic, an idle stack never refusing for a wait, and 503 for a model whose workers are gone."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmq_api.admission import (
    IDLE,
    Admitted,
    Prediction,
    Queues,
    Saturation,
    ShedPolicy,
    Unfinished,
    all_unfinished,
    cycles_wait_ms,
    merge_reports,
    prediction_verdict,
    retry_after_s,
)
from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.constants import PRIORITY_CLASSES
from llmq_core.settings import Settings
from tests.unit.api.fakes import refusal

PAID, FREE, NEAR, DEFERRED = PRIORITY_CLASSES
SIM, TINY = "llmq-sim", "llmq-tiny"
NOW = 1_000_000
POLICY = ShedPolicy.from_settings(
    Settings(api={"max_in_flight": 100}, batcher={"max_queued": 1000, "worker_heartbeat_timeout_ms": 2000})
)


def classes(**loads: tuple) -> dict[str, wire.QueueLoad]:
    """class=(depth, oldest age ms[, backlog drain rate])"""
    return {
        key.replace("_paid", ":paid").replace("_free", ":free"): wire.QueueLoad(
            depth=load[0], oldest_age_ms=load[1], backlog_drained_per_s=(load + (0.0,))[2]
        )
        for key, load in loads.items()
    }


def model(workers: int = 1, seen_ms: int = NOW, capacity_per_s: float = 0.0, **loads: tuple) -> wire.ModelLoad:
    return wire.ModelLoad(
        classes=classes(**loads),
        workers=workers,
        slots=8 * workers,
        worker_seen_ms=seen_ms,
        capacity_per_s=capacity_per_s,
    )


def report(batcher_id: str, sent_ms: int, started_ms: int = 1, **models: wire.ModelLoad) -> wire.BatcherSaturation:
    return wire.BatcherSaturation(
        batcher_id=batcher_id,
        sent_ms=sent_ms,
        started_ms=started_ms,
        models={name.replace("_", "-"): load for name, load in models.items()},
    )


def saturation(models: dict[str, Queues], workers: dict[str, int] | None = None) -> Saturation:
    """Queues per model; every model has a live worker unless ``workers`` says otherwise."""
    return Saturation(models, workers if workers is not None else {m: 1 for m in (SIM, TINY)}, {}, 0, NOW)


def test_reports_merge_fresh_ones_per_model_and_age_them():
    reports = [
        report("b1", 10_000, llmq_sim=model(2, NOW, 200.0, interactive_paid=(3, 400, 30.0), deferred=(10, 9000))),
        report(
            "b2",
            9_000,
            llmq_sim=model(1, NOW, 100.0, interactive_paid=(2, 100, 20.0)),
            llmq_tiny=model(0, NOW, near_interactive=(4, 50)),
        ),
        report("b3", 1_000, llmq_sim=model(interactive_paid=(50, 60_000))),
    ]  # stale: ignored
    merged = merge_reports(reports, now_ms=10_500, stale_ms=5000)
    # b2's 100 ms + 1.5 s; drain rates add up (each batcher drains its share), workers' slots and capacity do not
    assert merged.queues[SIM] == Queues(
        {PAID: 5, DEFERRED: 10}, {PAID: 1600, DEFERRED: 9500}, {PAID: 50.0, DEFERRED: 0.0}, {PAID: 0.0, DEFERRED: 0.0}
    )
    assert (merged.slots[SIM], merged.capacity_per_s[SIM]) == (16, 200.0)
    assert merged.report_age_ms == 1000  # b1's 500 ms and b2's 1.5 s
    # A request waited 1.6 s: every slot is busy. Cycles of 80 ms (16 slots at the promised 200/s) take 4 each at the
    # measured 50/s: 5 ahead wait half a cycle, then one more.
    assert merged.predict(SIM, PAID) == Prediction(5, 120, False)
    assert merged.predict(SIM, DEFERRED) == Prediction(15, 280, False)  # no rate of its own: paid's, not a guess
    assert merged.predict(TINY, DEFERRED) == Prediction(4, 1550, False)  # no worker, no rate: the oldest age
    assert merged.predict(TINY, FREE) == Prediction(0, 0, False)
    assert merged.predict("never-reported", DEFERRED) == IDLE.predict(SIM, DEFERRED) == Prediction(0, 0, False)


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


# What people are told while no worker serves their model: retry once a worker could have come back (its timeout).
UNAVAILABLE = ("model_unavailable", 503, "server_error", "model_unavailable", "model", {"retry-after": "2"})
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
        assert refusal(rejection) == UNAVAILABLE
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
    reports = [
        report("old", NOW - 500, started_ms=NOW - 60_000, llmq_sim=model(workers=2, seen_ms=NOW - 600)),
        report(
            "new",
            NOW - 100,
            started_ms=NOW - 1_000,
            llmq_sim=model(workers=0, seen_ms=0),
            llmq_tiny=model(workers=0, seen_ms=NOW - 9_000),
        ),
    ]
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
    sat = saturation(
        {SIM: Queues({c: d for c, (d, _) in classes.items()}, {c: a for c, (d, a) in classes.items() if d})}
    )
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


SLOTS, CAPACITY_PER_S = 128, 256.0  # two llmq-sim workers x 64 per 500 ms
UNFINISHED = {(SIM, FREE): 300, (SIM, PAID): 78}  # llmq-sim requests the pods hold, per class

# Prediction of two llmq-sim workers (SLOTS, CAPACITY_PER_S: cycles of 500 ms): (reported depth per class, backlog drain
# rate per class, admitted here, unfinished in all pods) -> (queued, ms, next batch). Idle workers (no unfinished
# request) take a cycle's worth (the rate x 500 ms) at once and the next cycle 550 ms on; busy ones half a cycle on.
PREDICTIONS = [
    pytest.param({FREE: 300}, {}, {}, {}, FREE, (300, 2050, False), id="half-the-capacity-until-measured"),
    pytest.param({FREE: 300}, {FREE: 60.0}, {}, {}, FREE, (300, 5050, False), id="measured-rate-wins"),
    # 300/s over the promised 256/s: a cycle is 128 / 300 s, and the heartbeats' capacity bounds no measured rate
    pytest.param({FREE: 300}, {FREE: 300.0}, {}, {}, FREE, (300, 904, False), id="measured-rate-over-capacity-stands"),
    pytest.param(
        {PAID: 100, FREE: 200},
        {PAID: 50.0, FREE: 50.0},
        {},
        {},
        PAID,
        (100, 2050, True),
        id="lower-classes-do-not-delay-paid",
    ),
    pytest.param(
        {PAID: 100, FREE: 200}, {PAID: 50.0, FREE: 50.0}, {}, {}, FREE, (300, 6050, False), id="free-waits-behind-paid"
    ),
    pytest.param(
        {FREE: 100},
        {FREE: 50.0},
        {(SIM, FREE): 150, (TINY, FREE): 99, (SIM, NEAR): 7},
        {},
        FREE,
        (250, 5050, False),
        id="this-pods-admissions-since-the-report-count",
    ),
    # Still in Kafka or admitted by another pod: the batcher reported 10, the pods hold 378 (128 running: busy).
    pytest.param(
        {FREE: 10},
        {FREE: 50.0},
        {},
        {**UNFINISHED, (TINY, FREE): 999},
        FREE,
        (250, 5250, False),
        id="unfinished-in-all-pods-less-the-slots-bound-it-from-below",
    ),
    pytest.param(
        {PAID: 10},
        {PAID: 50.0},
        {},
        UNFINISHED,
        PAID,
        (10, 250, False),
        id="unfinished-lower-classes-do-not-delay-paid",
    ),
]


@pytest.mark.parametrize("depth,drain,admitted,unfinished,cls,expected", PREDICTIONS)
def test_predicted_wait_is_the_work_ahead_over_its_drain_rate(depth, drain, admitted, unfinished, cls, expected):
    sat = Saturation(
        {SIM: Queues(depth, {}, drain)}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS}, {SIM: CAPACITY_PER_S}, admitted, unfinished
    )
    assert sat.predict(SIM, cls) == Prediction(*expected)


def test_an_idle_stack_never_refuses_for_a_wait_whatever_the_threshold():
    # A slow measured drain (a 500 ms batch plus the pipeline's waits): one request already predicts more than 1 s.
    slow = Saturation({SIM: Queues({}, {}, {DEFERRED: 0.9})}, {SIM: 2}, {}, 0, NOW, {SIM: 128}, {SIM: 256.0})
    assert slow.predict(SIM, DEFERRED).wait_ms == 0 and POLICY.check(DEFERRED, SIM, slow, 0) is None
    queued = Saturation(
        {SIM: Queues({FREE: 127}, {}, {DEFERRED: 100.0})}, {SIM: 2}, {}, 0, NOW, {SIM: 128}, {SIM: 256.0}
    )
    # over deferred's 1 s (a cycle's 50 at once, the next cycle 550 ms on, then one more), but in the next batch
    assert queued.predict(SIM, DEFERRED) == Prediction(127, 1050, True)
    assert POLICY.check(DEFERRED, SIM, queued, 0) is None
    full = Saturation({SIM: Queues({FREE: 128}, {}, {DEFERRED: 100.0})}, {SIM: 2}, {}, 0, NOW, {SIM: 128}, {SIM: 256.0})
    assert POLICY.check(DEFERRED, SIM, full, 0).reason == "queue_wait"


def test_retry_after_on_a_stuck_queue_is_the_prediction_not_a_growing_age():
    # The queue is stuck (measured drain ~0): the oldest age grows, the prediction is capped at 60 s and stays there.
    for age_ms in (9_000, 18_000, 36_000):
        stuck = Saturation(
            {SIM: Queues({FREE: 300}, {FREE: age_ms}, {FREE: 0.01})}, {SIM: 1}, {}, 0, NOW, {SIM: 8}, {SIM: 16.0}
        )
        assert POLICY.check(FREE, SIM, stuck, 0).error.headers == {"retry-after": "60"}
    slow = Saturation(
        {SIM: Queues({FREE: 300}, {FREE: 36_000}, {FREE: 40.0})}, {SIM: 1}, {}, 0, NOW, {SIM: 8}, {SIM: 64.0}
    )
    assert POLICY.check(FREE, SIM, slow, 0).error.headers == {"retry-after": "8"}  # 7.5 s rounded up, age aside


BURST_RATE_PER_S = 100.0  # measured drain of the model while a backlog waited
BURST_LIMIT_MS = 5_000  # interactive:free's shed wait


def burst(clock: FakeClock, admitted: Admitted, report_ms: int, queued: dict[str, int], arrivals: list[str]):
    """Each arrival (a priority class) checked against one report plus this pod's admissions since it, like a pod."""
    outcomes = []
    for cls in arrivals:
        clock.advance(1)
        sat = merge_reports(
            [
                report(
                    "b",
                    report_ms,
                    llmq_sim=wire.ModelLoad(
                        classes={
                            c: wire.QueueLoad(depth=queued.get(c, 0), backlog_drained_per_s=BURST_RATE_PER_S)
                            for c in PRIORITY_CLASSES
                        },
                        workers=1,
                        slots=64,
                        worker_seen_ms=report_ms,
                        capacity_per_s=128.0,
                    ),
                )
            ],
            clock.now_ms(),
            5000,
            admitted=admitted,
        )
        predicted = sat.predict(SIM, cls)
        rejection = POLICY.check(cls, SIM, sat, 0)
        if rejection is None:
            admitted.add(SIM, cls, clock.now_ms())
        outcomes.append((cls, predicted, rejection))
    return outcomes


def test_a_burst_is_shed_as_soon_as_the_predicted_wait_crosses_the_limit_and_paid_traffic_beside_it_is_not():
    clock, admitted = FakeClock(NOW), Admitted()
    arrivals = ([FREE] * 3 + [PAID]) * 300  # 900 free, 300 paid at once, before the batcher reports any of them
    outcomes = burst(clock, admitted, NOW, {}, arrivals)
    free = [(p, r) for cls, p, r in outcomes if cls == FREE]
    refused_at = next(i for i, (_, r) in enumerate(free) if r is not None)
    # paid requests queue ahead of free ones: with 500 ahead (375 free + 125 paid) a request is the first over 5 s:
    # cycles of 500 ms (64 slots at the promised 128/s) take 50 each at the measured 100/s, and its is the 11th
    ahead_limit = int(BURST_LIMIT_MS * BURST_RATE_PER_S / 1000)
    assert free[refused_at][0].queued == ahead_limit and free[refused_at][0].wait_ms == 5050
    assert all(r is None for p, r in free[:refused_at]) and all(r is not None for p, r in free[refused_at:])
    assert all(p.wait_ms <= BURST_LIMIT_MS for p, r in free if r is None)
    for predicted, rejection in free[refused_at:]:
        assert rejection.reason == "queue_wait"
        assert rejection.error.headers == {"retry-after": str(min(60, -(-predicted.wait_ms // 1000)))}
    assert all(r is None for cls, _, r in outcomes if cls == PAID)  # paid: 300 ahead at most, 3 s < 15 s

    # The batcher's next report has them (and the pod forgets its own count): the same predictions follow.
    later = clock.now_ms() + 1
    clock.advance(5)
    more = burst(clock, admitted, later, {PAID: 300, FREE: refused_at}, [FREE, PAID])
    assert more[0][1].queued == 300 + refused_at and more[0][2] is not None
    assert more[1][1].queued == 300 and more[1][2] is None


def test_admitted_counts_expire_once_a_report_covers_them():
    admitted = Admitted()
    for t in (10, 20, 30):
        admitted.add(SIM, FREE, t)
    admitted.add(TINY, PAID, 25)
    admitted.add(SIM, FREE, 35, count=-1)
    assert admitted.since(0) == {(SIM, FREE): 2, (TINY, PAID): 1}
    assert admitted.since(20) == {(TINY, PAID): 1}  # the one at 30 and the one taken back at 35 cancel out
    assert admitted.since(35) == {}


def test_unfinished_counts_end_once_and_merge_with_the_fresh_reports_of_other_pods():
    unfinished = Unfinished()
    ends = [unfinished.start(SIM, FREE) for _ in range(3)] + [unfinished.start(TINY, PAID)]
    ends[0]()
    ends[0]()  # ending twice ends once
    ends[3]()
    assert unfinished.report("pod-a", NOW) == wire.PodUnfinished(
        instance_id="pod-a", sent_ms=NOW, models={SIM: {FREE: 2}}
    )
    others = [
        wire.PodUnfinished(instance_id="pod-b", sent_ms=NOW - 5000, models={SIM: {FREE: 7, PAID: 1}}),
        wire.PodUnfinished(instance_id="pod-gone", sent_ms=NOW - 5001, models={SIM: {FREE: 1000}}),
    ]
    assert all_unfinished(unfinished.counts, others, NOW, stale_ms=5000) == {(SIM, FREE): 9, (SIM, PAID): 1}


PODS, PUBLISH_MS = 2, 100


def two_pod_burst(arrivals_per_pod: int, kafka_lag_report_ms: int, share: bool) -> list[tuple[int, Prediction]]:
    """Two pods take a burst of free requests, one arrival per pod per ms, faster than any report: the batcher's last
    report (idle, no rate measured yet) is followed at ``kafka_lag_report_ms`` by one that has read only 50 of what
    was admitted (the rest is still in Kafka). Each pod counts its own unfinished requests at once and publishes them
    every PUBLISH_MS (``share``), reading the other's then. Returns (arrival ms, prediction) of each admission."""
    clock = FakeClock(NOW)
    pods = [(Admitted(), Unfinished()) for _ in range(PODS)]
    published: dict[int, wire.PodUnfinished] = {}
    reports = [
        report(
            "b", NOW, llmq_sim=wire.ModelLoad(workers=2, slots=SLOTS, worker_seen_ms=NOW, capacity_per_s=CAPACITY_PER_S)
        )
    ]
    admissions = []
    for t in range(arrivals_per_pod):
        clock.advance(1)
        if share and t % PUBLISH_MS == 0:
            published = {i: unfinished.report(f"pod-{i}", clock.now_ms()) for i, (_, unfinished) in enumerate(pods)}
        if t == kafka_lag_report_ms:
            reports = [
                report(
                    "b",
                    clock.now_ms(),
                    llmq_sim=wire.ModelLoad(
                        classes={FREE: wire.QueueLoad(depth=50)},
                        workers=2,
                        slots=SLOTS,
                        worker_seen_ms=NOW,
                        capacity_per_s=CAPACITY_PER_S,
                    ),
                )
            ]
        for i, (admitted, unfinished) in enumerate(pods):
            others = [p for j, p in published.items() if j != i]
            sat = merge_reports(
                reports,
                clock.now_ms(),
                5000,
                admitted=admitted,
                unfinished=all_unfinished(unfinished.counts, others, clock.now_ms(), 5000),
            )
            if POLICY.check(FREE, SIM, sat, 0) is None:
                admitted.add(SIM, FREE, clock.now_ms())
                unfinished.start(SIM, FREE)
                admissions.append((t, sat.predict(SIM, FREE)))
    return admissions


def test_a_burst_on_two_pods_faster_than_reports_admits_only_what_drains_within_the_limit():
    admissions = two_pod_burst(arrivals_per_pod=1500, kafka_lag_report_ms=300, share=True)
    assert all(predicted.wait_ms <= BURST_LIMIT_MS for _, predicted in admissions)
    # Work the pipeline drains within the limit at the assumed rate (half the capacity: none measured yet), plus what
    # the slots run at once; the other pod's admissions reach a pod within a publish interval (at most 100 here).
    fits = int(BURST_LIMIT_MS * CAPACITY_PER_S / 2 / 1000) + SLOTS
    assert fits <= len(admissions) <= fits + PUBLISH_MS
    # The 429s start as soon as the pods see that much work: within the burst's first 1,000 ms (2,000 arrivals).
    assert max(t for t, _ in admissions) < 1000
    # Without the other pod's counts each pod lets in a whole limit's worth: twice as much.
    assert len(two_pod_burst(arrivals_per_pod=1500, kafka_lag_report_ms=300, share=False)) > 2 * fits - PUBLISH_MS


def test_a_class_drains_at_what_the_classes_above_leave_it():
    # 256/s measured; paid is dispatched at 150/s (it keeps arriving and goes first): free gets 106/s
    queues = Queues({FREE: 300}, {}, {FREE: 256.0}, {PAID: 150.0, FREE: 100.0})
    sat = Saturation({SIM: queues}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS}, {SIM: CAPACITY_PER_S})
    assert sat.backlog_rate_per_s(SIM, FREE) == 256.0 and sat.drain_rate_per_s(SIM, FREE) == 106.0
    assert sat.drain_rate_per_s(SIM, PAID) == 256.0  # nothing above paid; its own rate is free's (none of its own)
    starved = Saturation({SIM: Queues({}, {}, {FREE: 100.0}, {PAID: 400.0})}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS})
    assert starved.drain_rate_per_s(SIM, FREE) == pytest.approx(20.0)  # MIN_CLASS_SHARE of the 400/s paid gets
    # the next batch is what the classes above leave of the slots: 128 x 106 / 256 = 53
    assert sat.predict(SIM, FREE).next_batch is False
    assert (
        Saturation({SIM: Queues({FREE: 52}, {}, {FREE: 256.0}, {PAID: 150.0})}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS})
        .predict(SIM, FREE)
        .next_batch
    )


def test_the_reports_age_counts_what_the_queues_were_dispatched_at_since():
    reports = [
        report(
            "b",
            NOW - 1000,
            llmq_sim=wire.ModelLoad(
                classes={FREE: wire.QueueLoad(depth=600, oldest_age_ms=3000, drained_per_s=200.0)},
                workers=2,
                slots=SLOTS,
                worker_seen_ms=NOW,
            ),
        )
    ]
    sat = merge_reports(reports, NOW, 5000)
    assert sat.report_age_ms == 1000 and sat.queued(SIM, [FREE]) == 400  # 600 reported, 200 gone since
    assert sat.running(SIM) == SLOTS  # a request waited 4 s: no slot is free


def test_a_batcher_without_a_measured_rate_counts_as_the_others_mean():
    def load(rate: float) -> wire.ModelLoad:
        return wire.ModelLoad(
            classes={FREE: wire.QueueLoad(backlog_drained_per_s=rate)}, workers=2, slots=SLOTS, worker_seen_ms=NOW
        )

    reports = [report("b1", NOW, llmq_sim=load(80.0)), report("b2", NOW, llmq_sim=load(90.0))]
    assert merge_reports(reports, NOW, 5000).queues[SIM].drain_per_s[FREE] == 170.0
    reports.append(report("b3", NOW, llmq_sim=load(0.0)))  # its partition never held a backlog
    assert merge_reports(reports, NOW, 5000).queues[SIM].drain_per_s[FREE] == 255.0


def test_admissions_count_after_each_batchers_report_for_its_share():
    admitted = Admitted()
    for t in range(100, 1100, 100):  # 10 admissions, one every 100 ms
        admitted.add(SIM, FREE, t)
    # three batchers reported at 200, 500 and 800 ms: each has a third of those before it (8, 5, 2 after)
    assert admitted.after([200, 500, 800]) == {(SIM, FREE): pytest.approx(5.0)}
    assert admitted.after([500]) == {(SIM, FREE): 5.0}  # the ones up to 200 ms are forgotten
    assert admitted.since(1000) == {}


CYCLES = [  # (queued ahead, free slots, busy) -> ms, for 100/s in cycles of 500 ms (50 a cycle)
    pytest.param(49, 128, False, 0, id="in-the-first-cycle"),
    pytest.param(50, 128, False, 550, id="the-next-cycle-after-the-batch-window"),
    pytest.param(149, 128, False, 1050, id="two-cycles-on"),
    pytest.param(0, 0, True, 250, id="busy-half-a-cycle-on-average"),
    pytest.param(120, 0, True, 1250, id="busy-two-more-cycles"),
]


@pytest.mark.parametrize("queued,free,busy,ms", CYCLES)
def test_work_ahead_is_taken_in_cycles(queued, free, busy, ms):
    assert cycles_wait_ms(queued, free, busy, 100.0, 0.5) == ms


@pytest.mark.parametrize(
    "predicted,measured,verdict",
    [(0, 250, "within"), (0, 251, "under"), (1000, 2000, "within"), (999, 2000, "under"), (3001, 2000, "over")],
)
def test_a_prediction_holds_within_half_the_measured_wait_or_250_ms(predicted, measured, verdict):
    assert prediction_verdict(predicted, measured) == verdict


def test_deferred_work_waiting_long_leaves_the_classes_above_it_their_slots():
    queues = Queues({DEFERRED: 500}, {DEFERRED: 30_000}, {DEFERRED: 100.0})
    sat = Saturation({SIM: queues}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS}, {SIM: CAPACITY_PER_S})
    assert sat.running(SIM, DEFERRED) == SLOTS  # behind its own backlog: no slot free
    assert sat.running(SIM, PAID) == 0  # paid preempts it (continuous batching) or has its reserved share
    assert sat.predict(SIM, PAID) == Prediction(0, 0, True)
    waited = Saturation({SIM: Queues({FREE: 5}, {FREE: 1500}, {FREE: 100.0})}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS})
    assert waited.running(SIM, PAID) == SLOTS  # a free request waited 1.5 s: the workers had no slot for it
    assert waited.predict(SIM, PAID) == Prediction(0, 640, False)  # half a cycle of 128 / 100 s


def test_the_workers_take_at_least_what_they_are_dispatched_now():
    # Nothing ever waited a whole report interval (no rate measured): paid and free take 195/s of the promised 256/s,
    # so the prior is half of what is left beyond them, not half of all (which near_interactive would then never get).
    dispatched = {PAID: 100.0, FREE: 95.0}
    sat = Saturation({SIM: Queues({}, {}, {}, dispatched)}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS}, {SIM: 256.0})
    assert sat.backlog_rate_per_s(SIM, NEAR) == pytest.approx(195 + 0.5 * 61)
    assert sat.drain_rate_per_s(SIM, NEAR) == pytest.approx(0.5 * 61)
    assert Saturation({SIM: Queues({}, {}, {}, {})}, {}, {}, 0, NOW, {SIM: SLOTS}, {SIM: 256.0}).backlog_rate_per_s(
        SIM, NEAR
    ) == pytest.approx(128.0)  # idle: half the promise
    stale = Saturation({SIM: Queues({}, {}, {FREE: 100.0}, {FREE: 150.0})}, {SIM: 2}, {}, 0, NOW, {SIM: SLOTS})
    assert stale.backlog_rate_per_s(SIM, FREE) == 150.0  # a measured rate below what goes out now

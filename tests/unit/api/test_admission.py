"""admission.py: merged batcher reports, the shed rules, Retry-After from the predicted wait, lowest class first."""

from hypothesis import given, settings, strategies as st

from llmq_core import wire
from llmq_core.constants import PRIORITY_CLASSES
from llmq_core.settings import Settings
from llmq_api.admission import IDLE, Saturation, ShedPolicy, merge_reports, retry_after_s

PAID, FREE, NEAR, DEFERRED = PRIORITY_CLASSES
POLICY = ShedPolicy.from_settings(Settings(api_max_in_flight=100, batcher_max_queued=1000))


def report(batcher_id: str, sent_ms: int, **loads: tuple[int, int]) -> wire.BatcherSaturation:
    return wire.BatcherSaturation(batcher_id=batcher_id, sent_ms=sent_ms, classes={
        key.replace("_paid", ":paid").replace("_free", ":free"): wire.QueueLoad(depth=d, oldest_age_ms=a)
        for key, (d, a) in loads.items()})


def test_reports_merge_fresh_ones_and_age_them():
    reports = [report("b1", 10_000, interactive_paid=(3, 400), deferred=(10, 9000)),
               report("b2", 9_000, interactive_paid=(2, 100), near_interactive=(0, 0)),
               report("b3", 1_000, interactive_paid=(50, 60_000))]  # stale: ignored
    merged = merge_reports(reports, now_ms=10_500, stale_ms=5000)
    assert merged.depth == {PAID: 5, DEFERRED: 10, NEAR: 0}
    assert merged.oldest_age_ms == {PAID: 1600, DEFERRED: 9500}  # b2's 100 ms + 1500 ms since its report
    assert merged.ahead(PAID) == (5, 1600) and merged.ahead(DEFERRED) == (15, 9500)
    assert IDLE.ahead(DEFERRED) == (0, 0)


def test_idle_system_admits_everyone():
    assert all(POLICY.check(c, IDLE, in_flight=0) is None for c in PRIORITY_CLASSES)


def test_predicted_wait_sheds_the_classes_behind_it_with_retry_after():
    saturation = Saturation({FREE: 4}, {FREE: 6_200})  # over free's 5 s: free and everything below
    assert POLICY.check(PAID, saturation, 0) is None
    for cls in (FREE, NEAR, DEFERRED):
        rejection = POLICY.check(cls, saturation, 0)
        assert rejection.reason == "queue_wait"
        error = rejection.error
        assert (error.status, error.code, error.type) == (429, "rate_limit_exceeded", "rate_limit_error")
        assert error.headers == {"retry-after": "7"}
    near_only = Saturation({NEAR: 1}, {NEAR: 2_500})
    assert [POLICY.check(c, near_only, 0) is None for c in PRIORITY_CLASSES] == [True, True, False, False]


def test_queue_depth_and_pod_in_flight_shares():
    deep = Saturation({PAID: 600}, {PAID: 10})  # 600 of 1000 queued: over deferred's 0.5 only
    assert [POLICY.check(c, deep, 0) is None for c in PRIORITY_CLASSES] == [True, True, True, False]
    assert POLICY.check(DEFERRED, deep, 0).reason == "queue_depth"
    assert [POLICY.check(c, IDLE, 72) is None for c in PRIORITY_CLASSES] == [True, True, False, False]
    assert POLICY.check(NEAR, IDLE, 72).reason == "pod_in_flight"
    assert POLICY.check(NEAR, IDLE, 72).error.headers == {"retry-after": "1"}
    assert POLICY.check(PAID, IDLE, 95) is not None


def test_retry_after_is_whole_seconds_within_bounds():
    assert [retry_after_s(ms) for ms in (0, 1, 1000, 1001, 59_500, 10**9)] == [1, 1, 1, 2, 60, 60]


loads = st.tuples(st.integers(0, 2000), st.integers(0, 30_000))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(PRIORITY_CLASSES), loads), st.integers(0, 120))
def test_a_shed_class_means_every_lower_class_is_shed(classes, in_flight):
    saturation = Saturation({c: d for c, (d, _) in classes.items()},
                            {c: a for c, (d, a) in classes.items() if d})
    admitted = [POLICY.check(c, saturation, in_flight) is None for c in PRIORITY_CLASSES]
    assert admitted == sorted(admitted, reverse=True)  # admitted classes form a prefix: highest first

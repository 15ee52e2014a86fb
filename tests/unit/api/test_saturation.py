"""saturation.py: reads the batchers' reports, ignores garbage and stale ones, forgets reports of long-gone batchers."""

from llmq_api.admission import STALE_REPORT_INTERVALS, Prediction, ShedPolicy, is_stale
from llmq_api.saturation import FORGET_AFTER_MS, SaturationMonitor
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from tests.fakes import FakeRedis


def report(batcher_id: str, sent_ms: int, depth: int, age_ms: int) -> bytes:
    return wire.encode(
        wire.BatcherSaturation(
            batcher_id=batcher_id,
            sent_ms=sent_ms,
            models={
                "llmq-sim": wire.ModelLoad(
                    classes={"interactive:paid": wire.QueueLoad(depth=depth, oldest_age_ms=age_ms)}
                )
            },
        )
    )


async def test_monitor_merges_fresh_reports_and_drops_dead_ones():
    redis, clock = FakeRedis(), FakeClock(10_000_000)
    now = clock.now_ms()
    redis.hashes["sat"] = {
        b"b1": report("b1", now - 1000, 2, 300),
        b"b2": report("b2", now - 6000, 9, 9000),
        b"gone": report("gone", now - FORGET_AFTER_MS - 1, 1, 1),
        b"junk": b"\x00",
    }
    monitor = SaturationMonitor(redis, clock, stale_ms=5000, key="sat")
    await monitor.refresh()
    assert set(redis.hashes["sat"]) == {b"b1", b"b2"}
    # b2 is stale, b1 aged by a second (no rate known: the oldest age is the wait)
    assert monitor.current.predict("llmq-sim", "interactive:paid") == Prediction(2, 1300, False)
    clock.advance(10_000)  # no fresh report: admission sees an idle system
    assert monitor.current.predict("llmq-sim", "deferred") == Prediction(0, 0, False)


async def test_monitor_counts_the_pods_admissions_until_a_report_sent_after_them_arrives():
    redis, clock = FakeRedis(), FakeClock(10_000_000)
    redis.hashes["sat"] = {b"b1": report("b1", clock.now_ms(), 0, 0)}
    monitor = SaturationMonitor(redis, clock, stale_ms=5000, key="sat")
    await monitor.refresh()
    clock.advance(100)
    ends = [monitor.admit("llmq-sim", "interactive:paid") for _ in range(3)]
    ends[2](True)  # taken back: the rate limiter refused it
    assert monitor.current.predict("llmq-sim", "interactive:paid").queued == 2
    redis.hashes["sat"] = {b"b1": report("b1", clock.now_ms(), 2, 50)}  # the batcher has them now
    await monitor.refresh()
    assert monitor.current.predict("llmq-sim", "interactive:paid").queued == 2


async def test_monitor_shares_its_unfinished_requests_with_the_other_pods_until_they_end():
    redis, clock = FakeRedis(), FakeClock(10_000_000)
    pods = [
        SaturationMonitor(redis, clock, stale_ms=5000, key="sat", instance_id=name, unfinished_key="unf")
        for name in ("pod-a", "pod-b")
    ]
    redis.hashes["unf"] = {b"gone": wire.encode(wire.PodUnfinished(instance_id="gone", sent_ms=1)), b"junk": b"x"}
    ends = [pods[0].admit("llmq-sim", "interactive:free") for _ in range(5)]
    pods[1].admit("llmq-sim", "interactive:paid")
    for pod in pods:
        await pod.refresh()
    assert set(redis.hashes["unf"]) == {b"pod-a", b"pod-b"}  # the long-gone pod's and the garbage are deleted
    assert pods[1].current.unfinished == {("llmq-sim", "interactive:free"): 5, ("llmq-sim", "interactive:paid"): 1}
    for end in ends[:3]:
        end()
    await pods[0].refresh()
    await pods[1].refresh()
    assert pods[1].current.unfinished[("llmq-sim", "interactive:free")] == 2
    clock.advance(5001)  # pod-a stopped publishing: gone
    await pods[1].refresh()
    assert pods[1].current.unfinished == {("llmq-sim", "interactive:paid"): 1}


async def test_a_batchers_report_counts_for_stale_report_intervals_then_the_pod_falls_back_to_its_own_cap():
    """Fresh: a model whose worker the batcher lost long ago answers 503 and the queue is seen. Stale, once the report
    missed STALE_REPORT_INTERVALS rewrites (api_saturation_stale_ms): no queue, no worker known, so no 503; only the
    pod's own in-flight cap sheds."""
    stale_ms = Settings().api.saturation_stale_ms
    assert stale_ms == STALE_REPORT_INTERVALS * constants.SATURATION_REPORT_INTERVAL_MS
    redis, clock = FakeRedis(), FakeClock(10_000_000)
    now = clock.now_ms()
    lost = wire.ModelLoad(classes={"interactive:paid": wire.QueueLoad(depth=3, oldest_age_ms=0)}, worker_seen_ms=1)
    sent = wire.BatcherSaturation(batcher_id="b1", sent_ms=now, started_ms=1, models={"llmq-sim": lost})
    redis.hashes["sat"] = {b"b1": wire.encode(sent)}
    monitor = SaturationMonitor(redis, clock, stale_ms, key="sat")
    await monitor.refresh()
    shed = ShedPolicy.from_settings(Settings())
    clock.advance(stale_ms)  # at the bound: still fresh
    fresh = monitor.current
    assert fresh.predict("llmq-sim", "interactive:paid").queued == 3
    assert shed.check("interactive:paid", "llmq-sim", fresh, 0).reason == "model_unavailable"
    clock.advance(1)
    stale = monitor.current
    assert stale.queues == {} and stale.watching_since_ms is None
    assert shed.check("interactive:paid", "llmq-sim", stale, 0) is None
    assert shed.check("interactive:paid", "llmq-sim", stale, shed.max_in_flight).reason == "pod_in_flight"


def test_staleness_is_a_report_older_than_the_bound():
    assert not is_stale(1000, 1000 + 5000, 5000) and is_stale(1000, 1000 + 5001, 5000)

"""The saturation report writer (llmq_batcher.report), on a FakeClock: rewritten every interval with or without
rounds, a failed write counted in a metric, logged and retried the next interval, and a recovery."""

from __future__ import annotations

import logging

from llmq_batcher.report import ReportWriter
from llmq_batcher.shared import Shared
from llmq_core import constants, wire
from llmq_core.metrics import BatcherMetrics
from tests.fakes import FakeProducer, FakeRedis
from tests.unit.batcher.helpers import NAMES, T0, make_policy

INTERVAL_MS = constants.SATURATION_REPORT_INTERVAL_MS
FAILURES = "llmq_batcher_saturation_report_failures_total"


class FlakyRedis(FakeRedis):
    """A FakeRedis that refuses every pipeline while ``down``."""

    down = False

    def pipeline(self, transaction: bool = False):
        if self.down:
            raise ConnectionError("Redis is down")
        return super().pipeline(transaction)


def make_writer(rounds: int) -> tuple[ReportWriter, FlakyRedis, list[int | None]]:
    """A writer whose :meth:`ReportWriter.run` sleeps by advancing its FakeClock and stops after ``rounds`` sleeps;
    the list gets, at each sleep, the ``sent_ms`` of the report in Redis then (None: none yet)."""
    policy, clock = make_policy()
    redis = FlakyRedis()
    shared = Shared(policy, FakeProducer(), redis, clock, NAMES, BatcherMetrics())
    seen: list[int | None] = []

    async def sleep(seconds: float) -> None:
        seen.append(sent_ms(redis))
        if len(seen) == rounds:
            shared.stopping.set()
        clock.advance(round(seconds * 1000))

    return ReportWriter(shared, sleep=sleep), redis, seen


def sent_ms(redis: FakeRedis) -> int | None:
    reports = redis.hashes.get(NAMES.saturation_key, {})
    return wire.decode(reports[b"t"]).sent_ms if reports else None


def failures(writer: ReportWriter) -> float:
    return writer.shared.metrics.registry.get_sample_value(FAILURES) or 0


async def test_without_rounds_the_report_is_rewritten_every_interval():
    writer, redis, seen = make_writer(rounds=4)
    await writer.run()
    assert seen == [None, T0, T0 + INTERVAL_MS, T0 + 2 * INTERVAL_MS]  # the first at once, then one per interval
    assert sent_ms(redis) == T0 + 3 * INTERVAL_MS and failures(writer) == 0


async def test_rounds_write_when_due_and_the_task_fills_in_when_they_do_not():
    writer, redis, seen = make_writer(rounds=1)
    policy, clock = writer.shared.policy, writer.shared.clock
    await writer.after_round(policy.schedule(clock.now_ms()))
    clock.advance(INTERVAL_MS // 2)
    await writer.after_round(policy.schedule(clock.now_ms()))  # within the interval: not written
    assert sent_ms(redis) == T0
    await writer.run()  # no round since: the task writes once the interval since the last write is over
    assert seen == [T0] and sent_ms(redis) == T0 + INTERVAL_MS
    await writer.after_round(policy.schedule(clock.now_ms()), force=True)  # a drain writes at once
    assert failures(writer) == 0


async def test_a_failed_write_is_counted_logged_and_retried_the_next_interval_until_redis_is_back(caplog):
    writer, redis, seen = make_writer(rounds=3)
    redis.down = True
    with caplog.at_level(logging.WARNING, logger="llmq_batcher.report"):
        await writer.run()  # the writes at T0 and one and two intervals later all fail
    assert failures(writer) == 3 and seen == [None] * 3 and sent_ms(redis) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"writing the saturation report failed, again in {INTERVAL_MS} ms: ConnectionError('Redis is down')"
    ] * 3
    clock, policy = writer.shared.clock, writer.shared.policy
    redis.down = False
    assert writer.due_in_ms(clock.now_ms()) == INTERVAL_MS  # a failure does not retry every round: once an interval
    clock.advance(INTERVAL_MS)
    await writer.after_round(policy.schedule(clock.now_ms()))  # Redis is back: the next write goes through
    assert sent_ms(redis) == T0 + 3 * INTERVAL_MS and failures(writer) == 3

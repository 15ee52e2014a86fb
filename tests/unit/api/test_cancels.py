"""The API pod's CancelSender: queued, pipelined, kept through failures, bounded, and ended by its stop."""

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from llmq_api.cancels import GROUP, CancelSender
from llmq_api.metrics import ApiMetrics
from llmq_core import wire
from tests.fakes import FakePipeline, FakeRedis

CHANNEL = "llmq:cancels"


class FlakyRedis(FakeRedis):
    """A FakeRedis whose pipelines fail while ``failures`` lasts (each execute takes one), or, with ``hang``, wait on
    it before they run; ``executes``: how many pipelines ran."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.hang: asyncio.Event | None = None
        self.executes = 0

    def pipeline(self, transaction: bool = False) -> FakePipeline:
        pipe, run = FakePipeline(self), FakePipeline.execute

        async def execute() -> list:
            try:
                if self.hang is not None:
                    await self.hang.wait()
                if self.failures:
                    self.failures -= 1
                    raise RedisConnectionError("refused")
            except BaseException:
                for command in pipe.queued:  # the coroutines of the PUBLISHes that never ran
                    command.close()
                raise
            self.executes += 1
            return await run(pipe)

        pipe.execute = execute
        return pipe


def dropped(metrics: ApiMetrics, reason: str = "deadline_exceeded") -> float:
    return metrics.registry.get_sample_value("llmq_api_cancels_dropped_total", {"reason": reason}) or 0


def published(metrics: ApiMetrics, reason: str = "deadline_exceeded") -> float:
    return metrics.registry.get_sample_value("llmq_api_cancels_published_total", {"reason": reason}) or 0


async def until(condition) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never came true")


@pytest.fixture
def metrics() -> ApiMetrics:
    return ApiMetrics(lambda: 0)


async def test_a_flood_goes_out_in_order_in_pipelined_groups(metrics):
    redis = FlakyRedis()
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=10_000)
    for i in range(3 * GROUP):
        sender.send(f"r{i}", "deadline_exceeded")  # returns at once: nothing is published yet
    assert redis.published == [] and len(sender) == 3 * GROUP
    await until(lambda: len(redis.published) == 3 * GROUP)
    assert [wire.decode(data).request_id for _, data in redis.published] == [f"r{i}" for i in range(3 * GROUP)]
    assert {channel for channel, _ in redis.published} == {CHANNEL}
    assert redis.executes <= 3 and published(metrics) == 3 * GROUP and len(sender) == 0
    await sender.stop(1.0)
    assert dropped(metrics) == 0


async def test_a_failing_redis_loses_none(metrics):
    redis = FlakyRedis(failures=3)
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=100)
    sender.send("a", "client_disconnected")
    sender.send("b", "deadline_exceeded")
    await until(lambda: len(redis.published) == 2)
    assert [wire.decode(data).request_id for _, data in redis.published] == ["a", "b"]
    assert redis.failures == 0 and published(metrics) == 1 and dropped(metrics) == 0
    await sender.stop(1.0)


async def test_past_its_bound_a_cancel_is_dropped_and_counted(metrics):
    redis = FlakyRedis()
    redis.hang = asyncio.Event()
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=3)
    for i in range(5):
        sender.send(f"r{i}", "deadline_exceeded")
    assert len(sender) == 3 and dropped(metrics) == 2
    redis.hang.set()
    await until(lambda: len(redis.published) == 3)
    await sender.stop(1.0)


async def test_stop_ends_the_task_and_counts_what_never_went_out(metrics):
    redis = FlakyRedis(failures=1_000_000)
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=100)
    sender.send("a", "deadline_exceeded")
    sender.send("b", "deadline_exceeded")
    await until(lambda: redis.failures < 1_000_000)  # it tried, and backs off
    await asyncio.wait_for(sender.stop(5.0), 1.0)  # the one more try fails at once: no wait for the bound
    assert sender._task.done() and len(sender) == 0 and dropped(metrics) == 2 and published(metrics) == 0
    sender.send("c", "deadline_exceeded")  # after the stop: dropped, no task started
    assert dropped(metrics) == 3 and sender._task.done() and len(sender) == 0


async def test_stop_cuts_a_hung_publish_at_its_bound(metrics):
    redis = FlakyRedis()
    redis.hang = asyncio.Event()  # never set
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=100)
    sender.send("a", "deadline_exceeded")
    await asyncio.wait_for(sender.stop(0.05), 1.0)
    assert sender._task.done() and dropped(metrics) == 1 and redis.published == []


async def test_stop_sends_what_is_queued(metrics):
    redis = FlakyRedis()
    sender = CancelSender(redis, CHANNEL, metrics, max_queued=100)
    sender.send("a", "pod_draining")
    await sender.stop(1.0)
    assert [wire.decode(data).request_id for _, data in redis.published] == ["a"] and dropped(
        metrics, "pod_draining"
    ) == 0

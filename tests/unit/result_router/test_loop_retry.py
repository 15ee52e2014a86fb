"""ResultRouter.run survives a Redis error (the batch is routed again from its first record, then committed) and commits
at most once per KAFKA_COMMIT_INTERVAL_MS."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from redis.exceptions import ConnectionError as RedisConnectionError

import llmq_result_router.loop as router_loop
from llmq_core import constants, wire
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from tests.fakes import FakeConsumer, FakeRedis

TP = ("llmq.results", 0)


class FlakyRedis(FakeRedis):
    """Fails its first SET (a pooled connection a Redis restart closed), then stores."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def set(self, key, value, **options):
        if self.failures:
            self.failures -= 1
            raise RedisConnectionError("Connection closed by server.")
        return await super().set(key, value, **options)


def record(offset: int, request_id: str):
    result = wire.FinalResult(
        request_id=request_id,
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=wire.HttpReply(instance_id="pod-1"),
    )
    return SimpleNamespace(
        topic=TP[0], partition=TP[1], offset=offset, key=request_id.encode(), value=wire.encode(result), headers=[]
    )


async def test_a_redis_error_routes_the_batch_again_and_commits_once_it_went_through(monkeypatch):
    monkeypatch.setattr(router_loop, "RETRY_DELAY_S", 0)
    consumer, redis = FakeConsumer({TP: [record(0, "r0"), record(1, "r1")]}), FlakyRedis()
    router = ResultRouter(Settings(), consumer, producer=None, redis=redis)
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert set(redis.data) == {constants.result_key("r0"), constants.result_key("r1")}
    assert consumer.commits == [None]


async def test_fetches_inside_the_commit_window_share_one_commit_and_stopping_commits_the_rest():
    from llmq_core.clock import FakeClock

    fetches = [{TP: [record(i, f"r{i}")]} for i in range(3)]
    consumer, redis = FakeConsumer(*fetches), FakeRedis()
    router = ResultRouter(Settings(), consumer, producer=None, redis=redis, clock=FakeClock())
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert len(redis.data) == 3
    assert consumer.commits == [None, None]  # the first fetch's, then at the stop the two the window held back

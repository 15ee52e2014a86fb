"""ResultRouter.run survives a Redis error (the batch is routed again from its first record, then committed) and commits
at most once per KAFKA_COMMIT_INTERVAL_MS."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError

import llmq_result_router.loop as router_loop
from llmq_core import constants
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from tests.fake_results import result_record, succeeded
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


async def test_a_redis_error_routes_the_batch_again_and_commits_once_it_went_through(monkeypatch):
    monkeypatch.setattr(router_loop, "RETRY_DELAY_S", 0)
    consumer, redis = (
        FakeConsumer({TP: [result_record(0, succeeded("r0")), result_record(1, succeeded("r1"))]}),
        FlakyRedis(),
    )
    router = ResultRouter(Settings(), consumer, producer=None, redis=redis)
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert set(redis.data) == {constants.result_key("r0"), constants.result_key("r1")}
    assert consumer.commits == [None]


async def test_fetches_inside_the_commit_window_share_one_commit_and_stopping_commits_the_rest():
    fetches = [{TP: [result_record(i, succeeded(f"r{i}"))]} for i in range(3)]
    consumer, redis = FakeConsumer(*fetches), FakeRedis()
    router = ResultRouter(Settings(), consumer, producer=None, redis=redis, clock=FakeClock())
    consumer.drained = router.stop
    await asyncio.wait_for(router.run(), 5)
    assert len(redis.data) == 3
    assert consumer.commits == [None, None]  # the first fetch's, then at the stop the two the window held back

"""ResultRouter.run survives a Redis error: the batch is routed again from its first record, then committed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from redis.exceptions import ConnectionError as RedisConnectionError

import llmq_result_router.loop as router_loop
from llmq_core import constants, wire
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter

TP = ("llmq.results", 0)


class FakeConsumer:
    def __init__(self, records) -> None:
        self.records = records
        self.position = 0
        self.commits = 0
        self.router: ResultRouter | None = None

    async def getmany(self, timeout_ms, max_records):
        batch = self.records[self.position :]
        if not batch:
            self.router.stop()
            return {}
        self.position = len(self.records)
        return {TP: batch}

    def seek(self, tp, offset) -> None:
        assert tp == TP
        self.position = offset

    async def commit(self) -> None:
        self.commits += 1


class FlakyRedis:
    """Fails its first SET (a pooled connection a Redis restart closed), then stores."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}
        self.failures = 1

    async def set(self, key, value, px=None, nx=False):
        if self.failures:
            self.failures -= 1
            raise RedisConnectionError("Connection closed by server.")
        self.stored.setdefault(key, value)
        return True

    def register_script(self, script):
        async def put(keys, args):  # ResultStore's script, as far as these tests need it: SET NX of the result
            return [int(bool(await self.set(keys[0], args[0], nx=True))), 0]

        return put


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
    consumer, redis = FakeConsumer([record(0, "r0"), record(1, "r1")]), FlakyRedis()
    router = consumer.router = ResultRouter(Settings(), consumer, producer=None, redis=redis)
    await asyncio.wait_for(router.run(), 5)
    assert set(redis.stored) == {constants.result_key("r0"), constants.result_key("r1")}
    assert consumer.commits == 1

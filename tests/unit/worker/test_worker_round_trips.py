"""What one batch costs the worker in round trips, counted with fakes (nothing timed): a streamed batch's chunks of one
tick reach Redis in one pipeline, and its results share one wait for their acks."""

from __future__ import annotations

import asyncio

from llmq_core import wire
from llmq_worker.core import WorkerCore
from llmq_worker.engines.simulated import SimulatedEngine
from llmq_worker.loop import WorkerLoop
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis
from tests.unit.worker.worker_fakes import batch, make_request

REQUESTS = 8
TOKENS = 4  # one tick per token: 4 ticks


class CountingRedis(FakeRedis):
    def __init__(self) -> None:
        super().__init__()
        self.round_trips = 0

    def pipeline(self, transaction: bool = False):
        pipe = super().pipeline(transaction)
        execute = pipe.execute

        async def counted() -> list:
            self.round_trips += 1
            return await execute()

        pipe.execute = counted
        return pipe


async def test_a_streamed_batch_costs_one_redis_round_trip_per_tick_not_per_request(manual_time):
    engine = SimulatedEngine(batch_time_ms=400, clock=manual_time.clock, sleep=manual_time.sleep)
    core = WorkerCore(worker_id="w1", partition=0, model="llmq-sim", engine=engine, clock=manual_time.clock)
    redis, producer = CountingRedis(), FakeProducer()
    loop = WorkerLoop(
        core=core,
        engine=engine,
        consumer=FakeConsumer(),
        producer=producer,
        redis=redis,
        clock=manual_time.clock,
        heartbeat_interval_ms=100,
        shutdown_grace_s=1,
        max_pending=REQUESTS,
    )
    events = asyncio.create_task(loop._events())
    try:
        requests = [make_request(f"r{i}", "abcd", max_tokens=TOKENS) for i in range(REQUESTS)]
        await loop._deliver(core.take_batch(batch(*requests), offset=0))
        await manual_time.advance(400)
    finally:
        events.cancel()
        await engine.close()
    published = [wire.decode(data) for _, data in redis.published]
    assert sum(isinstance(m, wire.FinalResult) for m in published) == REQUESTS == len(producer.sent)
    assert sum(isinstance(m, wire.TokenChunk) for m in published) == REQUESTS * TOKENS
    assert redis.round_trips == TOKENS  # the last tick's chunks and the results go together

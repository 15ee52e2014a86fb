"""WorkerLoop commits at most every KAFKA_COMMIT_INTERVAL_MS: a later delivery inside the window waits for the next
heartbeat (or the drain), and nothing is committed before its batch is delivered."""

from __future__ import annotations

from aiokafka import TopicPartition

from llmq_core import constants
from llmq_core.clock import FakeClock
from llmq_worker.core import WorkerCore
from llmq_worker.loop import WorkerLoop
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis
from tests.unit.worker.worker_fakes import T0_MS, StepEngine, batch, make_request

BATCHES = TopicPartition(constants.TOPIC_BATCHES, 0)


def setup():
    clock = FakeClock(T0_MS + 100)
    engine = StepEngine(clock)
    core = WorkerCore(worker_id="w1", partition=0, model="llmq-sim", engine=engine, clock=clock)
    loop = WorkerLoop(
        core=core,
        engine=engine,
        consumer=FakeConsumer(),
        producer=FakeProducer(log=[]),
        redis=FakeRedis(log=[]),
        clock=clock,
        heartbeat_interval_ms=100,
        shutdown_grace_s=1,
        max_pending=8,
    )
    return loop, core, engine, clock


async def run_batch(loop, core, engine, request_id: str, offset: int) -> None:
    core.take_batch(batch(make_request(request_id, "hi", stream=False)), offset=offset)
    await loop._deliver(core.on_events(engine.step()))


async def test_deliveries_inside_the_window_share_one_later_commit():
    loop, core, engine, clock = setup()
    await run_batch(loop, core, engine, "a", 0)
    assert loop._consumer.commits == [{BATCHES: 1}]  # the first commit is not held back
    await run_batch(loop, core, engine, "b", 1)
    await run_batch(loop, core, engine, "c", 2)
    assert loop._consumer.commits == [{BATCHES: 1}]  # inside the window: held back
    await loop._commit()  # what the heartbeat does: still inside the window
    assert len(loop._consumer.commits) == 1
    clock.advance(constants.KAFKA_COMMIT_INTERVAL_MS)
    await loop._commit()
    assert loop._consumer.commits == [{BATCHES: 1}, {BATCHES: 3}]
    await loop._commit(force=True)  # nothing new: nothing sent
    assert len(loop._consumer.commits) == 2


async def test_the_drain_commits_what_the_window_held_back():
    loop, core, engine, _ = setup()
    await run_batch(loop, core, engine, "a", 0)
    await run_batch(loop, core, engine, "b", 1)
    await loop._commit(force=True)
    assert loop._consumer.commits == [{BATCHES: 1}, {BATCHES: 2}]

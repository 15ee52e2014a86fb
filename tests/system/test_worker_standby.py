"""A second worker process given a held partition of llmq.batches waits as its standby, consuming nothing, and serves
the partition once the first is killed with SIGKILL (llmq_worker.lease on the real Redis and Kafka)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis
from aiokafka import TopicPartition

from llmq_core import ids, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import TOPIC_RESULTS, alive_key, worker_lease_key
from llmq_core.kafka import make_consumer, make_producer
from llmq_worker.lease import Holder
from tests.builders import generation_request
from tests.inprocess.test_worker_lease import PARTITION, until
from tests.stacks import reap, send_batch, worker_process

pytestmark = pytest.mark.integration

MODEL = "llmq-sim-lease-itest"  # no batcher routes real traffic here
TTL_MS = 3000


async def logged(log: Path, text: str, bound_s: float = 60) -> None:
    """Wait until a worker's ``log`` holds ``text``."""
    async with asyncio.timeout(bound_s):
        while text not in log.read_text():
            await asyncio.sleep(0.05)


async def results_of(consumer, request_ids: set[str], bound_s: float = 60) -> list[wire.FinalResult]:
    """Final results on llmq.results for ``request_ids``, read until each has one."""
    found: list[wire.FinalResult] = []
    async with asyncio.timeout(bound_s):
        while not request_ids <= {r.request_id for r in found}:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                decoded = (wire.decode_record(record.value, record.headers) for record in records)
                found += [m for m in decoded if isinstance(m, wire.FinalResult) and m.request_id in request_ids]
    return found


def one_request(request_id: str) -> wire.GenerationRequest:
    return generation_request(
        request_id,
        now_ms=SYSTEM_CLOCK.now_ms(),
        deadline_in_ms=60_000,
        instance_id="lease-itest-pod",
        model=MODEL,
        prompt="lease",
        sampling=wire.SamplingParams(max_tokens=3),
    )


async def test_a_second_worker_on_a_held_partition_is_a_standby_until_the_first_is_killed(settings, tmp_path):
    run = uuid.uuid4().hex[:8]
    # the ids the workers run under: their region qualifies the names they are given
    first_id, second_id = (ids.instance_id(settings.region.name, f"lease-{n}-{run}") for n in "ab")
    redis = aioredis.from_url(settings.redis.url)
    producer, results = make_producer(settings), make_consumer(settings, group_id=None)
    await asyncio.gather(producer.start(), results.start())
    result_tps = [TopicPartition(TOPIC_RESULTS, p) for p in range(settings.kafka.results_topic_partitions)]
    results.assign(result_tps)
    await results.seek_to_end(*result_tps)
    for tp in result_tps:
        await results.position(tp)
    workers = []
    try:
        for worker_id in (first_id, second_id):
            options = ("--batch-time-ms", "50", "--metrics-port", "0")
            env = {"LLMQ_WORKER_LEASE_TTL_MS": str(TTL_MS)}
            with (tmp_path / f"{worker_id}.log").open("wb") as log:
                workers.append(
                    await worker_process(
                        settings, worker_id, PARTITION, MODEL, *options, env=env, stdout=log, stderr=log
                    )
                )
            if worker_id == first_id:  # the first holds the partition and heartbeats before the second starts
                await until(lambda: redis.exists(alive_key("worker", first_id)))
        first, second = workers
        second_log = tmp_path / f"{second_id}.log"
        await logged(second_log, f"partition {PARTITION} of llmq.batches is held by worker {first_id}")
        await send_batch(producer, f"lease-1-{run}", first_id, PARTITION, one_request(f"r1-{run}"))
        [served] = await results_of(results, {f"r1-{run}"})
        assert served.worker_id == first_id and not await redis.exists(alive_key("worker", second_id))

        first.send_signal(signal.SIGKILL)
        killed_s = time.monotonic()
        await first.wait()
        await logged(second_log, f"holding partition {PARTITION}", bound_s=TTL_MS / 1000 + 30)
        took_over_s = time.monotonic() - killed_s
        await send_batch(producer, f"lease-2-{run}", second_id, PARTITION, one_request(f"r2-{run}"))
        found = await results_of(results, {f"r2-{run}"})
        assert [r.worker_id for r in found] == [second_id]
        assert took_over_s < TTL_MS / 1000 + 30  # in fact at its next poll: the killed holder was of this host
        holder = msgspec.json.decode(await redis.get(worker_lease_key(PARTITION)), type=Holder)
        assert (holder.worker_id, holder.pid) == (second_id, second.pid)
        second.send_signal(signal.SIGTERM)
        try:
            exit_code = await asyncio.wait_for(second.wait(), 60)
        except TimeoutError:
            pytest.fail(f"the worker did not stop on SIGTERM; its log ends:\n{second_log.read_text()[-3000:]}")
        assert exit_code == 0
        assert await redis.get(worker_lease_key(PARTITION)) is None  # let go on a clean stop
    finally:
        await reap(*workers)
        await producer.stop()
        await results.stop()
        await redis.aclose()

"""result-router process: wires settings, clients and logging to the ResultRouter loop.

Run: ``python -m llmq_result_router.main [--instance-id ID] [--metrics-port PORT]``.
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis

from llmq_core import constants, kafka, metrics, runtime, tracing
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.filestore import FileStore
from llmq_core.jobstore import JobStore
from llmq_core.labels import LabelSet
from llmq_core.redis_client import check_memory_policy
from llmq_core.settings import load_settings
from llmq_core.telemetry import setup_logging
from llmq_result_router.jobs import JobDriver, JobLedger
from llmq_result_router.loop import ResultRouter


async def serve(instance_id: str, metrics_port: int | None = None) -> None:
    settings = load_settings()
    setup_logging("result-router", settings.log_level)
    tracing.configure("result-router", settings)
    observed = metrics.RouterMetrics(LabelSet.from_settings(settings))
    stop_metrics = metrics.serve(
        observed.registry, settings.metrics_port if metrics_port is None else metrics_port, settings.metrics_host
    )
    await kafka.ensure_topics(settings)
    await kafka.require_topic_limits(settings)
    redis = Redis.from_url(settings.redis_url)
    await check_memory_policy(redis, "result-router")
    producer = kafka.make_renewable_producer(settings)  # a refused reply or dead letter does not break it
    consumer = kafka.make_consumer(settings, constants.TOPIC_RESULTS, group_id=constants.GROUP_RESULT_ROUTER)
    await producer.start()
    await consumer.start()
    store = JobStore(redis)
    router = ResultRouter(
        settings, consumer, producer, redis, JobLedger(settings, store, producer, SYSTEM_CLOCK), metrics=observed
    )
    driver = JobDriver(settings, store, FileStore(settings.files_url), producer, redis, SYSTEM_CLOCK)
    stop = runtime.stop_event()
    alive = asyncio.create_task(runtime.keep_alive(redis, "result-router", instance_id, {"pid": os.getpid()}))
    lag = asyncio.create_task(observed.lag.watch(consumer, constants.GROUP_RESULT_ROUTER))
    tasks = [asyncio.create_task(router.run()), asyncio.create_task(driver.run())]
    stopped = asyncio.create_task(stop.wait())
    # A loop that dies (Redis or Kafka gone for good) ends the process, so its supervisor restarts it.
    await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    router.stop()
    driver.stop()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), settings.shutdown_grace_s)
    finally:
        alive.cancel()
        lag.cancel()
        await consumer.stop()
        await producer.stop()
        await redis.aclose()
        tracing.shutdown()
        if stop_metrics is not None:
            stop_metrics()


def main() -> None:
    args = runtime.service_arguments("llmq result-router")
    runtime.run(lambda: serve(args.instance_id, args.metrics_port))


if __name__ == "__main__":
    main()

"""batcher process: wires settings, clients and logging to the BatcherLoop.

Run: ``python -m llmq_batcher.main [--instance-id ID] [--metrics-port PORT]``. Env ``LLMQ_*`` (see llmq_core.settings).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import BatchPolicy, PolicyConfig
from llmq_core import constants, kafka, metrics, requests, runtime, tracing
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.labels import LabelSet
from llmq_core.names import Names
from llmq_core.redis_client import make_redis
from llmq_core.settings import load_settings
from llmq_core.telemetry import setup_logging

log = logging.getLogger(__name__)


async def serve(instance_id: str, metrics_port: int | None = None) -> None:
    settings = load_settings()
    setup_logging("batcher", settings.log_level)
    tracing.configure("batcher", settings)
    labels = LabelSet.from_settings(settings)
    observed = metrics.BatcherMetrics(labels)
    stop_metrics = metrics.serve(
        observed.registry, settings.metrics_port if metrics_port is None else metrics_port, settings.metrics_host
    )
    await kafka.ensure_topics(settings)
    await kafka.require_topic_limits(settings)
    redis = make_redis(settings.redis_url)
    producer = kafka.make_renewable_producer(settings)  # a refused record does not break it
    consumer = kafka.make_consumer(settings, group_id=constants.GROUP_BATCHER)
    results = kafka.make_consumer(settings, constants.TOPIC_RESULTS, group_id=None, auto_offset_reset="latest")
    # Batch ids must be unique across restarts: workers report them back as last_batch_id.
    policy = BatchPolicy(PolicyConfig.from_settings(settings, f"{instance_id}-{uuid.uuid4().hex[:6]}"), SYSTEM_CLOCK)
    loop = BatcherLoop(
        policy,
        consumer,
        producer,
        redis,
        SYSTEM_CLOCK,
        max_queued=settings.batcher_max_queued,
        results=results,
        metrics=observed,
        pod_check_ms=settings.pod_heartbeat_interval_ms,
        pod_grace_ms=2 * settings.pod_heartbeat_interval_ms,
        catalogue=labels.models,
        names=Names.from_settings(settings),
        rules=requests.Rules.from_settings(settings),
        request_id_ttl_ms=settings.kafka_request_id_ttl_s * 1000,
    )
    await producer.start()
    loop.subscribe()
    await consumer.start()
    await results.start()
    stop = runtime.stop_event()
    alive = asyncio.create_task(runtime.keep_alive(redis, "batcher", instance_id, {"pid": os.getpid()}))
    lag = asyncio.create_task(observed.lag.watch(consumer, constants.GROUP_BATCHER))
    task = asyncio.create_task(loop.run())
    log.info("batcher %s started", instance_id)
    await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    loop.stop()
    try:
        await asyncio.wait_for(task, settings.shutdown_grace_s)
    finally:
        alive.cancel()
        lag.cancel()
        for client in (consumer, results, producer):
            await client.stop()
        await redis.aclose()
        tracing.shutdown()
        if stop_metrics is not None:
            stop_metrics()
        log.info("batcher %s stopped", instance_id)


def main() -> None:
    args = runtime.service_arguments("llmq batcher")
    runtime.run(lambda: serve(args.instance_id, args.metrics_port))


if __name__ == "__main__":
    main()

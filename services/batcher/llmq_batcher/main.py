"""batcher process: wires settings, clients and logging to the BatcherLoop.

Run: ``python -m llmq_batcher.main [--instance-id ID] [--metrics-port PORT]``. Env ``LLMQ_*`` (see llmq_core.settings).
"""

from __future__ import annotations

import contextlib
import functools

from llmq_batcher.capacity import SharedCapacity
from llmq_batcher.intake import EntryRules
from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import BatchPolicy, PolicyConfig
from llmq_batcher.signals import PodChecks
from llmq_core import constants, ids, kafka, metrics, runtime
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.labels import LabelSet
from llmq_core.names import Names
from llmq_core.settings import Settings

# The settings groups the batcher reads (validated at start; a bad value elsewhere is no concern of it)
GROUPS = ("region", "kafka", "redis", "api", "models", "jobs", "batcher", "router", "observability", "runtime")


async def build(
    instance_id: str, metrics_port: int | None, settings: Settings, stack: contextlib.AsyncExitStack
) -> runtime.Work:
    labels = LabelSet.from_settings(settings)
    observed = metrics.BatcherMetrics(labels)
    runtime.serve_metrics(stack, observed.registry, settings, metrics_port)
    if settings.kafka.security_protocol == "PLAINTEXT":  # secure clusters: only the admin creates topics
        await kafka.ensure_topics(settings)
    await kafka.require_topic_limits(settings)
    redis = runtime.redis(stack, settings)
    producer = kafka.make_renewable_producer(settings)  # a refused record does not break it
    consumer = kafka.make_consumer(settings, group_id=constants.GROUP_BATCHER)
    # The results tail only ends in-flight counts (tenant caps; capacity comes from heartbeats and predicted batch ends),
    # so it may lag as the result-router does: a fetch about 10 times a second instead of one per produced result.
    results = kafka.make_consumer(
        settings,
        constants.TOPIC_RESULTS,
        group_id=None,
        auto_offset_reset="latest",
        fetch_max_wait_ms=settings.kafka.results_fetch_max_wait_ms,
        fetch_min_bytes=settings.kafka.results_fetch_min_bytes,
    )
    policy = BatchPolicy(PolicyConfig.from_settings(settings, ids.batch_id_prefix(instance_id)))
    names = Names.from_settings(settings)
    loop = BatcherLoop(
        policy,
        consumer,
        producer,
        redis,
        SYSTEM_CLOCK,
        max_queued=settings.batcher.max_queued,
        names=names,
        metrics=observed,
        results=results,
        entry=EntryRules.from_settings(settings),
        pods=PodChecks.from_settings(settings),
        catalogue=labels.models,
        capacity=SharedCapacity(redis, names, settings) if settings.batcher.shared_capacity else None,
        # a secure cluster lists only the topics a principal may describe, and the batcher may not describe reply
        # topics: there the result-router's check alone stands
        list_topics=(lambda: kafka.cluster_topics(producer))
        if settings.kafka.security_protocol == "PLAINTEXT"
        else None,
    )
    await runtime.start(stack, producer)
    await kafka.await_topics(settings, loop.topics())  # a topic missing at the group's join stays unassigned for long
    loop.subscribe()
    await runtime.start(stack, consumer, results)
    return runtime.Work(
        tasks=[loop.run()],
        stop=loop.stop,
        grace_s=settings.runtime.shutdown_grace_s,
        helpers=[observed.lag.watch(consumer, constants.GROUP_BATCHER)],
        liveness=redis,
    )


def main() -> None:
    settings = runtime.service_settings(*GROUPS)
    args = runtime.service_arguments("llmq batcher", settings)
    runtime.run(
        lambda: runtime.serve(
            "batcher", args.instance_id, functools.partial(build, args.instance_id, args.metrics_port), settings
        )
    )


if __name__ == "__main__":
    main()

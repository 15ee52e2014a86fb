"""result-router process: wires settings, clients and logging to the ResultRouter loop.

Run: ``python -m llmq_result_router.main [--instance-id ID] [--metrics-port PORT]``.
"""

from __future__ import annotations

import contextlib
import functools

from llmq_core import constants, kafka, metrics, runtime
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.labels import LabelSet
from llmq_core.redis_client import check_memory_policy
from llmq_core.settings import Settings
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog
from llmq_jobs.store import JobStore
from llmq_result_router.jobs import JobDriver, JobLedger
from llmq_result_router.loop import ResultRouter
from llmq_result_router.moved import MovedJobs
from llmq_result_router.once import KafkaReplyFinder
from llmq_result_router.owners import OwnerWatcher
from llmq_result_router.peers import PEER_TOPICS_REFRESH_MS, PeerResults

# The settings groups the result-router reads (validated at start; a bad value elsewhere is no concern of it)
GROUPS = ("region", "kafka", "redis", "api", "models", "jobs", "result_store", "router", "observability", "runtime")


async def build(
    instance_id: str, metrics_port: int | None, settings: Settings, stack: contextlib.AsyncExitStack
) -> runtime.Work:
    observed = metrics.RouterMetrics(LabelSet.from_settings(settings))
    runtime.serve_metrics(stack, observed.registry, settings, metrics_port)
    if settings.kafka.security_protocol == "PLAINTEXT":  # secure clusters: only the admin creates topics
        await kafka.ensure_topics(settings)
    await kafka.require_topic_limits(settings)
    redis = runtime.redis(stack, settings)
    await check_memory_policy(redis, "result-router")
    producer = kafka.make_renewable_producer(settings)  # a refused reply or dead letter does not break it
    await kafka.await_topics(settings, [constants.TOPIC_RESULTS])  # one missing at the join stays unassigned for long
    consumer = kafka.make_consumer(
        settings,
        constants.TOPIC_RESULTS,
        group_id=constants.GROUP_RESULT_ROUTER,
        fetch_max_wait_ms=settings.kafka.results_fetch_max_wait_ms,
        fetch_min_bytes=settings.kafka.results_fetch_min_bytes,
    )
    owners_consumer = kafka.make_consumer(
        settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )  # the claims on jobs (fencing across regions)
    moved_consumer = kafka.make_consumer(
        settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )  # the peers' job topics: this region's view of the jobs they took over
    replies_consumer = kafka.make_consumer(
        settings, group_id=None, enable_auto_commit=False
    )  # searches a reply topic for a reply claimed but never marked delivered (llmq_result_router.once)
    await runtime.start(stack, producer, consumer, owners_consumer, moved_consumer, replies_consumer)
    store = JobStore(redis, log=JobLog(producer))
    files = FileStore(settings.jobs.files_url)
    moved = MovedJobs(settings, store, files, moved_consumer, settings.region.peer_regions)
    owners = OwnerWatcher(store, owners_consumer, settings.region.name, settings.region.peer_regions, moved.moved)
    router = ResultRouter(
        settings,
        consumer,
        producer,
        redis,
        JobLedger(settings, store, producer, SYSTEM_CLOCK),
        metrics=observed,
        instance_id=instance_id,
        finder=KafkaReplyFinder(replies_consumer, producer.partitions_for),
    )
    driver = JobDriver(settings, store, files, producer, redis, SYSTEM_CLOCK, owners, holder=instance_id)
    peer_consumer = kafka.make_consumer(
        settings, group_id=constants.GROUP_PEER_RESULTS, metadata_max_age_ms=PEER_TOPICS_REFRESH_MS
    )
    peers = PeerResults(peer_consumer, router.results, redis, settings.kafka.request_id_ttl_s * 1000)
    peers.subscribe()
    await runtime.start(stack, peer_consumer)

    def stop() -> None:
        router.stop()
        driver.stop()
        owners.stop()
        moved.stop()
        peers.stop()

    return runtime.Work(
        tasks=[router.run(), driver.run(), owners.run(), moved.run(), peers.run()],
        stop=stop,
        grace_s=settings.runtime.shutdown_grace_s,
        helpers=[observed.lag.watch(consumer, constants.GROUP_RESULT_ROUTER)],
        liveness=redis,
    )


def main() -> None:
    settings = runtime.service_settings(*GROUPS)
    args = runtime.service_arguments("llmq result-router", settings)
    runtime.run(
        lambda: runtime.serve(
            "result-router", args.instance_id, functools.partial(build, args.instance_id, args.metrics_port), settings
        )
    )


if __name__ == "__main__":
    main()

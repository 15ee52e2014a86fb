"""Two regions on this machine with MirrorMaker 2 both ways (``two_regions``): a batch-job topic's records reach the
peer region within the replication lag (measured: docs/operations/multi-region.md); a Kafka-direct request that finished in
region a, re-sent to region b, gets a's stored answer once instead of running again; a region SIGKILLed whole leaves
its peer serving and mirrors again once revived; between secure clusters MirrorMaker 2 signs in as ``mm2``. The
regions are the package's (tests/system/regions/conftest.py: secure clusters)."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
import uuid

import httpx
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from llmq_core import constants, ids, kafka, security, wire
from llmq_core.redis_client import make_redis
from llmq_core.settings import Settings
from tests.stacks import kcat_request, wait_for_topic

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # two whole stacks and MirrorMaker 2 both ways start first
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by `make test`"),
]
DEV_KEY = {"authorization": "Bearer llmq-dev-key"}
LAG_RECORDS = 200
LAG_RATE_PER_S = 40
RPO_P99_S = 5.0  # the goal for the replication lag


async def read_all(settings: Settings, topic: str, timeout_s: float = 60) -> list:
    """Every record of ``topic`` up to its end now."""
    consumer = kafka.make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records = []
        async with asyncio.timeout(timeout_s):
            while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records += batch
        return records
    finally:
        await consumer.stop()


async def mirrored_values(settings: Settings, topic: str, count: int, timeout_s: float = 60) -> list[bytes]:
    """The values of ``topic`` once it holds ``count`` records (polled: MirrorMaker 2 creates a remote topic before it
    copies records into it)."""
    async with asyncio.timeout(timeout_s):
        while len(records := await read_all(settings, topic)) < count:
            await asyncio.sleep(0.5)
    return [record.value for record in records]


async def mirror_one(source: Settings, source_region: str, target: Settings, topic: str, value: bytes) -> list[bytes]:
    """Create ``topic`` in the source region, produce ``value`` to it, and return what its mirror in the target
    region (``<source_region>.<topic>``) holds once it appears (MirrorMaker 2 notices new topics at its refresh)."""
    await kafka.create_topic(source, topic)
    producer = kafka.make_producer(source)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()
    remote = constants.remote_topic(source_region, topic)
    await wait_for_topic(target, remote, timeout_s=120)
    return await mirrored_values(target, remote, 1)


async def test_records_of_a_job_topic_reach_the_peer_region_within_the_lag_goal(regions):
    a, b = regions.a.cfg.settings(), regions.b.cfg.settings()
    topic = constants.TOPIC_JOBS_PREFIX + "lag-probe"
    remote = constants.remote_topic("a", topic)
    await kafka.create_topic(a, topic)
    producer = kafka.make_producer(a)
    await producer.start()
    consumer = kafka.make_consumer(b, group_id=None)
    try:
        await producer.send_and_wait(topic, b"-1", key=b"warm-up")
        noticed_s = await wait_for_topic(b, remote, timeout_s=120)  # refresh.topics.interval.seconds = 5 in tests
        await consumer.start()
        consumer.assign([TopicPartition(remote, 0)])
        await consumer.seek_to_beginning(TopicPartition(remote, 0))
        received: dict[int, float] = {}

        async def receive() -> None:
            while len(received) < LAG_RECORDS:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    now = time.time()
                    received.update((int(r.value), now) for r in batch if r.value != b"-1")

        receiving = asyncio.create_task(receive())
        sent: dict[int, float] = {}
        for i in range(LAG_RECORDS):
            sent[i] = time.time()
            await producer.send_and_wait(topic, str(i).encode(), key=str(i).encode())
            await asyncio.sleep(1 / LAG_RATE_PER_S)
        await asyncio.wait_for(receiving, 60)
    finally:
        await producer.stop()
        await consumer.stop()
    lags = sorted(received[i] - sent[i] for i in sent)
    p50, p99 = statistics.median(lags), lags[int(0.99 * len(lags)) - 1]
    print(
        f"\nreplication lag a->b over {LAG_RECORDS} records at {LAG_RATE_PER_S}/s: p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms; new topic noticed in {noticed_s:.1f} s"
    )
    assert set(received) == set(sent)  # every record, once each key
    assert p99 <= RPO_P99_S


async def test_a_direct_request_finished_in_a_and_resent_to_b_gets_as_stored_answer_once(regions):
    request_id = f"mr-{uuid.uuid4().hex[:12]}"
    now_ms = int(time.time() * 1000)
    request = {
        "type": "generation_request",
        "request_id": request_id,
        "tenant_id": "team-a",
        "model": "llmq-sim",
        "prompt": "finished in a",
        "sampling": {"max_tokens": 12},
        "created_ms": now_ms,
        "deadline_ms": now_ms + 120_000,
        "reply_to": {"kind": "kafka", "topic": f"team.replies.{request_id}"},
    }
    topic = constants.requests_topic(constants.INTERACTIVE)
    first = await kcat_request(regions.a, topic, request)
    assert first["outcome"] == "succeeded" and not first.get("request_copy")
    b = regions.b.cfg.settings()
    redis = make_redis(b)
    try:  # a's result, mirrored as a.llmq.results, stored and claimed by b's result-router
        async with asyncio.timeout(120):
            while not await redis.exists(constants.request_copy_key(ids.tenant_scoped_id("team-a", request_id))):
                await asyncio.sleep(0.2)
    finally:
        await redis.aclose()
    again = await kcat_request(regions.b, topic, request)  # the producer fails over to region b
    assert again["choices"] == first["choices"] and again["usage"] == first["usage"]
    assert again["request_copy"].startswith(topic)  # the re-sent record in b, answered from a's result
    results = [wire.decode_record(r.value, r.headers) for r in await read_all(b, constants.TOPIC_RESULTS)]
    in_b = [r for r in results if ids.producer_request_id(r.request_id) == request_id]
    assert len(in_b) == 1 and in_b[0].request_copy  # b answered the copy from a's result; nothing ran in b


async def test_a_killed_region_leaves_its_peer_serving_and_mirrors_again_once_revived(regions):
    killed = regions.kill(regions.a)
    assert {"kafka", "redis", "batcher", "result-router", "api-0", "mirror-b"} <= set(killed)
    assert regions.a.status() == []  # nothing of region a runs
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{regions.b.cfg.api_ports[0]}", timeout=60) as client:
        body = {"model": "llmq-sim", "prompt": "b serves on", "max_tokens": 4}
        response = await client.post("/v1/completions", json=body, headers=DEV_KEY)
    assert response.status_code == 200 and response.json()["id"].startswith("cmpl-b-")
    regions.revive(regions.a)
    b, a = regions.b.cfg.settings(), regions.a.cfg.settings()
    # a's inbound mirror runs again
    assert await mirror_one(b, "b", a, constants.TOPIC_JOBS_PREFIX + "fail-back", b"after revival") == [
        b"after revival"
    ]
    # a's Kafka came back on its data: the topic created before the loss is still there
    assert await read_all(a, constants.TOPIC_JOBS_PREFIX + "lag-probe")


async def test_mirror_maker_2_mirrors_between_secure_clusters_as_mm2_and_no_more(regions):
    a, b = regions.a.cfg.settings(), regions.b.cfg.settings()  # the admin principal (a super user)
    assert a.kafka.security_protocol == "SASL_SSL" and b.kafka.security_protocol == "SASL_SSL"
    topic = constants.TOPIC_JOBS_PREFIX + "secure-probe"
    assert await mirror_one(a, "a", b, topic, b"over SASL_SSL") == [b"over SASL_SSL"]
    mm2 = kafka.make_producer(regions.a.cfg.settings(security.ROLE_MM2))
    await mm2.start()
    try:  # least privilege: mm2 may not write the request path
        with pytest.raises(TopicAuthorizationFailedError):
            await mm2.send_and_wait(constants.requests_topic(constants.INTERACTIVE), b"x")
    finally:
        await mm2.stop()

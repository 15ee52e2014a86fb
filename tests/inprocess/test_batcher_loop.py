"""The batcher loop against a real broker and Redis, on private topics and channels so it disturbs no one."""

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import msgspec
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from llmq_batcher.intake import EntryRules
from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import BatchPolicy, PolicyConfig
from llmq_core import constants, ids, kafka, requests, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.names import Names
from llmq_core.settings import Settings
from tests.builders import generation_request, heartbeat

pytestmark = pytest.mark.integration

MODEL = "llmq-sim"
WORKER_PARTITION = 2


def _names(tag: str) -> Names:
    prefix = f"test.batcher.{tag}"
    requests = tuple(f"{prefix}.requests.{c}" for c in constants.TRAFFIC_CLASSES)
    return Names(
        request_topics=requests,
        deferred_topic=requests[2],
        batches_topic=f"{prefix}.batches",
        results_topic=f"{prefix}.results",
        dead_letters_topic=f"{prefix}.dead-letters",
        heartbeats_channel=f"test:{tag}:heartbeats",
        cancels_channel=f"test:{tag}:cancels",
        stats_key=f"test:{tag}:stats",
    )


async def _create_topics(settings: Settings, names: Names, max_message_bytes: dict[str, int] | None = None) -> None:
    """The private topics; ``max_message_bytes`` sets max.message.bytes of some of them (else the broker's default)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        layout = {t: 2 for t in names.request_topics}
        layout.update({names.batches_topic: 4, names.results_topic: 1, names.dead_letters_topic: 1})
        limits = max_message_bytes or {}
        await admin.create_topics(
            [
                NewTopic(t, n, 1, topic_configs={"max.message.bytes": str(limits[t])} if t in limits else None)
                for t, n in layout.items()
            ]
        )
        await kafka.await_ready(admin, list(layout), 60, raise_on_timeout=True)  # or the group's join misses one
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def _running_batcher(
    config: PolicyConfig | None = None,
    *,
    slots: int = 8,
    max_message_bytes: Callable[[Names], dict[str, int]] | None = None,
):
    """A BatcherLoop on fresh private topics, with one worker of ``slots`` slots heartbeating; yields (names, producer,
    redis, consumer, loop). ``max_message_bytes``: max.message.bytes of some topics, by name. Producers take records up
    to KAFKA_MAX_MESSAGE_BYTES. Leaving stops the loop the way SIGTERM does."""
    settings = Settings()
    tag = uuid.uuid4().hex[:8]
    names = _names(tag)
    await _create_topics(settings, names, max_message_bytes(names) if max_message_bytes else None)
    redis = Redis.from_url(settings.redis.url)

    def make_producer():
        return kafka.make_producer(settings, max_request_size=constants.KAFKA_MAX_MESSAGE_BYTES)

    producer = make_producer()  # the test's own
    consumer = kafka.make_consumer(settings, group_id=f"test-batcher-{tag}")
    policy = BatchPolicy(config or PolicyConfig.defaults(tag))
    # the checks of requests from Kafka with the fake worker's context window unknown (as for LLMQ_MODELS_EXTRA): the
    # tests' multi-MiB prompts are about record sizes, not the model's window
    renewable = kafka.RenewableProducer(make_producer)
    loop = BatcherLoop(
        policy,
        consumer,
        renewable,
        redis,
        SYSTEM_CLOCK,
        max_queued=1000,
        names=names,
        entry=EntryRules(requests.Rules(windows={MODEL: 0})),
        list_topics=lambda: kafka.cluster_topics(renewable),
    )
    await producer.start()
    await loop.producer.start()
    loop.subscribe()
    await consumer.start()
    task = asyncio.create_task(loop.run())
    heartbeat = asyncio.create_task(_heartbeats(redis, names, slots))
    await _assigned_everything(consumer, names)
    await _heard_the_worker(loop)
    try:
        yield names, producer, redis, consumer, loop
    finally:
        heartbeat.cancel()
        loop.stop()
        await asyncio.wait_for(task, 15)
        await consumer.stop()
        await producer.stop()
        await loop.producer.stop()
        await redis.aclose()


@pytest.fixture(scope="module")
async def running():
    async with _running_batcher() as running:
        yield running


@pytest.fixture
def batcher(running):
    names, producer, redis, consumer, _ = running
    return names, producer, redis, consumer


async def _assigned_everything(consumer, names: Names, bound_s: float = 60) -> None:
    """Wait until the group holds every partition of the private request topics: a topic whose metadata arrives after
    the first assignment makes the group rebalance, and a request held across that rebalance is forgotten, uncommitted
    (at least once, as designed), which a test about commits would misread."""
    wanted = {TopicPartition(t, p) for t in names.request_topics for p in range(2)}
    deadline = time.monotonic() + bound_s
    while not wanted <= consumer.assignment():
        assert time.monotonic() < deadline, f"the batcher's group never held {sorted(wanted - consumer.assignment())}"
        await asyncio.sleep(0.05)


async def _heard_the_worker(loop: BatcherLoop, bound_s: float = 60) -> None:
    """Wait until the loop counts the fake worker live: its Redis subscription may start after the first heartbeats,
    and a test that stops the loop before then finds nothing to dispatch (its held request stays uncommitted)."""
    deadline = time.monotonic() + bound_s
    while (state := loop.policy.model_states(SYSTEM_CLOCK.now_ms()).get(MODEL)) is None or not state.workers:
        assert time.monotonic() < deadline, "the batcher never heard the fake worker's heartbeats"
        await asyncio.sleep(0.05)


async def _heartbeats(redis: Redis, names: Names, slots: int = 8) -> None:
    while True:
        hb = heartbeat(
            MODEL, worker_id="w-test", partition=WORKER_PARTITION, max_slots=slots, sent_ms=SYSTEM_CLOCK.now_ms()
        )
        await redis.publish(names.heartbeats_channel, wire.encode(hb))
        await asyncio.sleep(0.2)


def _request(
    request_id: str, pod: str, deadline_in_ms: int = 30_000, *, prompt: str = "abc", tenant: str = "default"
) -> wire.GenerationRequest:
    return generation_request(
        request_id,
        now_ms=SYSTEM_CLOCK.now_ms(),
        deadline_in_ms=deadline_in_ms,
        instance_id=pod,
        tenant_id=tenant,
        model=MODEL,
        prompt=prompt,
    )


async def _next_message(pubsub, timeout_s: float) -> dict | None:
    """The next message of ``pubsub`` within ``timeout_s`` (None if none came); the subscription is closed after."""
    deadline, message = time.monotonic() + timeout_s, None
    while message is None and time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
    await pubsub.aclose()
    return message


async def _read_one(settings: Settings, topic: str, match, timeout_s: float = 30):
    """The first record of ``topic`` (from its start) for which ``match(record)`` is true."""
    reader = kafka.make_consumer(settings, topic, group_id=None)
    await reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=500)).values():
                for record in records:
                    if match(record):
                        return record
        raise AssertionError(f"no matching record on {topic}")
    finally:
        await reader.stop()


async def test_json_request_becomes_a_batch_at_the_workers_partition_and_is_committed(batcher):
    names, producer, _, consumer = batcher
    settings = Settings()
    request = _request(f"req-{uuid.uuid4().hex}", "pod-x")
    meta = await producer.send_and_wait(
        names.request_topics[0], wire.encode(request, constants.CONTENT_TYPE_JSON), key=request.request_id.encode()
    )  # kcat style: no content-type header

    def has_request(record):
        batch = wire.decode(record.value)
        return any(r.request_id == request.request_id for r in batch.requests)

    record = await _read_one(settings, names.batches_topic, has_request)
    batch = wire.decode(record.value, wire.content_type_of(record.headers))
    assert record.partition == WORKER_PARTITION
    assert batch.worker_id == "w-test" and batch.model == MODEL
    assert [r.request_id for r in batch.requests] == [request.request_id]
    tp = TopicPartition(meta.topic, meta.partition)
    for _ in range(50):
        if (await consumer.committed(tp) or 0) > meta.offset:
            break
        await asyncio.sleep(0.2)
    assert await consumer.committed(tp) == meta.offset + 1


async def test_the_same_kafka_direct_id_of_two_tenants_runs_as_two_requests(batcher):
    """Issue 34 item 1: Kafka-direct ids were one namespace, so beta's request joined (or was refused as a reuse of)
    acme's request of the same id."""
    names, producer, _, _ = batcher
    request_id = f"order-{uuid.uuid4().hex}"
    replies = {tenant: f"test.batcher.{tenant}.replies.{request_id}" for tenant in ("acme", "beta")}
    for topic in replies.values():  # a reply topic exists before its requests are produced
        assert await kafka.create_topic(Settings(), topic)
    for tenant in ("acme", "beta"):
        request = msgspec.structs.replace(
            _request(request_id, "unused", tenant=tenant), reply_to=wire.KafkaReply(topic=replies[tenant])
        )
        await kafka.send_message(producer, names.request_topics[0], request, key=request_id)
    wanted = {ids.tenant_scoped_id(tenant, request_id): tenant for tenant in ("acme", "beta")}
    seen: dict[str, str] = {}

    def has_both(record) -> bool:
        seen.update({r.request_id: r.tenant_id for r in wire.decode(record.value).requests if r.request_id in wanted})
        return seen == wanted

    await _read_one(Settings(), names.batches_topic, has_both)


async def test_a_kafka_direct_request_whose_reply_topic_does_not_exist_is_refused_at_entry(running):
    """It ran in full, then its result was dead-lettered: now it is answered errored at entry (the result-router
    dead-letters that answer, in the producer's format) and never queued, so nothing is computed."""
    names, producer, _, _, loop = running
    request_id = f"order-{uuid.uuid4().hex}"
    topic = f"test.batcher.never-created.{request_id}"
    request = msgspec.structs.replace(
        _request(request_id, "unused", tenant="acme"), reply_to=wire.KafkaReply(topic=topic)
    )
    scoped = ids.tenant_scoped_id("acme", request_id)
    deadline = time.monotonic() + 30
    while loop.intake.reply_topics.wait_ms() > 0:  # another test's listing: the next one is due within a refresh
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await kafka.send_message(
        producer, names.request_topics[0], request, key=request_id, content_type=constants.CONTENT_TYPE_JSON
    )
    logged = await _read_one(Settings(), names.results_topic, lambda r: r.key == scoped.encode())
    result = wire.decode(logged.value, wire.content_type_of(logged.headers))
    assert result.outcome is wire.Outcome.ERRORED and result.reply_to == wire.KafkaReply(topic=topic)
    assert (result.error.code, result.error.param) == ("invalid_reply_topic", "reply_to.topic")
    assert "does not exist" in result.error.message
    assert not loop.policy.holds(scoped)  # answered at entry: never queued, never in a batch


async def test_expired_request_is_answered_to_its_pod_and_the_results_log(batcher):
    names, producer, redis, _ = batcher
    pod = f"pod-{uuid.uuid4().hex[:8]}"
    pubsub = redis.pubsub()
    await pubsub.subscribe(constants.replies_channel(pod))
    request = _request(f"req-{uuid.uuid4().hex}", pod, deadline_in_ms=-1)
    await kafka.send_message(producer, names.request_topics[1], request, key=request.request_id)
    message = await _next_message(pubsub, timeout_s=30)
    assert message is not None, "no reply on the pod channel"
    result = wire.decode(message["data"])
    assert result.request_id == request.request_id and result.outcome is wire.Outcome.EXPIRED
    logged = await _read_one(Settings(), names.results_topic, lambda r: r.key == request.request_id.encode())
    assert wire.decode(logged.value).outcome is wire.Outcome.EXPIRED


async def test_cancel_before_arrival_answers_canceled(running):
    names, producer, redis, _, loop = running
    request = _request(f"req-{uuid.uuid4().hex}", "pod-y")
    await redis.publish(names.cancels_channel, wire.encode(wire.Cancel(request_id=request.request_id)))
    async with asyncio.timeout(30):  # the cancel is seen before the request is produced
        while not loop.shared.policy.awaits_arrival(request.request_id):
            await asyncio.sleep(0.01)
    await kafka.send_message(producer, names.request_topics[0], request, key=request.request_id)
    logged = await _read_one(Settings(), names.results_topic, lambda r: r.key == request.request_id.encode())
    assert wire.decode(logged.value).outcome is wire.Outcome.CANCELED


async def test_undecodable_record_goes_to_dead_letters(batcher):
    names, producer, _, _ = batcher
    key = f"junk-{uuid.uuid4().hex}".encode()
    await producer.send_and_wait(names.request_topics[0], b"\xc1not a message", key=key)
    record = await _read_one(Settings(), names.dead_letters_topic, lambda r: r.key == key)
    assert record.value == b"\xc1not a message"
    assert any(k == "x-llmq-error" for k, _ in record.headers)


async def test_stop_drains_a_request_held_for_its_window_and_commits_it():
    config = PolicyConfig.defaults(
        uuid.uuid4().hex[:8], max_wait_ms={"interactive": 0, "near_interactive": 600_000, "deferred": 600_000}
    )
    request = wire.GenerationRequest(
        request_id=f"req-{uuid.uuid4().hex}",
        traffic_class="near_interactive",
        model=MODEL,
        prompt="abc",
        created_ms=SYSTEM_CLOCK.now_ms(),
        deadline_ms=SYSTEM_CLOCK.now_ms() + 60_000,
        reply_to=wire.HttpReply(instance_id="pod-z"),
    )
    async with _running_batcher(config) as (names, producer, _, consumer, loop):
        meta = await kafka.send_message(producer, names.request_topics[1], request, key=request.request_id)
        for _ in range(150):
            if loop.policy.queued_total:
                break
            await asyncio.sleep(0.2)
        assert loop.policy.queued_total == 1, "the request never reached the policy"
        loop.stop()
        tp = TopicPartition(meta.topic, meta.partition)
        deadline = (
            time.monotonic() + 30
        )  # the loop drains, then commits; polled: a loaded machine takes longer than 1 s
        while await consumer.committed(tp) != meta.offset + 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await consumer.committed(tp) == meta.offset + 1
    record = await _read_one(Settings(), names.batches_topic, lambda r: True)
    batch = wire.decode(record.value)
    assert batch.flush_reason == "drain" and [r.request_id for r in batch.requests] == [request.request_id]


# --- records the broker would refuse (issue 12 item 2) --------------------------------------------------------------


async def _read_until(topic: str, decode, wanted: set[str], timeout_s: float = 30) -> dict[str, list]:
    """Read ``topic`` from its start until the ids ``decode(value)`` yields cover ``wanted``: id -> decoded values."""
    reader = kafka.make_consumer(
        Settings(), topic, group_id=None, max_partition_fetch_bytes=constants.KAFKA_MAX_MESSAGE_BYTES
    )
    await reader.start()
    seen: dict[str, list] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while not wanted <= seen.keys() and time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=500)).values():
                for record in records:
                    message = wire.decode(record.value)
                    for request_id in decode(message):
                        seen.setdefault(request_id, []).append((message, len(record.value)))
        return seen
    finally:
        await reader.stop()


async def _send_all(producer, topic: str, requests: list[wire.GenerationRequest]) -> None:
    await asyncio.gather(*(kafka.send_message(producer, topic, r, key=r.request_id) for r in requests))


def _large_records(names: Names) -> dict[str, int]:
    return {t: constants.KAFKA_MAX_MESSAGE_BYTES for t in (*names.request_topics, names.batches_topic)}


async def test_requests_too_large_together_go_out_in_separate_records_and_others_flow_behind():
    pod = f"pod-{uuid.uuid4().hex[:8]}"
    big = [_request(f"big-{i}-{uuid.uuid4().hex}", pod, prompt="x" * (3 << 20), tenant="hostile") for i in range(3)]
    small = [_request(f"small-{i}-{uuid.uuid4().hex}", pod, tenant="other") for i in range(40)]
    async with _running_batcher(slots=64, max_message_bytes=_large_records) as (names, producer, _, _, loop):
        await _send_all(producer, names.request_topics[0], big)  # 9 MiB together: more than one record holds
        await _send_all(producer, names.request_topics[0], small)
        wanted = {r.request_id for r in big + small}
        seen = await _read_until(names.batches_topic, lambda b: [r.request_id for r in b.requests], wanted)
    assert wanted <= seen.keys(), f"{len(wanted - seen.keys())} requests never dispatched"
    assert all(len(seen[rid]) == 1 for rid in wanted), "a request was dispatched twice"
    batches = {batch.batch_id: size for values in seen.values() for batch, size in values}
    assert max(batches.values()) <= constants.KAFKA_MAX_MESSAGE_BYTES - constants.RECORD_HEADROOM_BYTES
    assert len({seen[r.request_id][0][0].batch_id for r in big}) >= 2, "three 3 MiB requests in one record"


async def test_a_record_the_batches_topic_refuses_is_answered_errored_and_others_keep_flowing():
    pod = f"pod-{uuid.uuid4().hex[:8]}"
    refused = _request(f"refused-{uuid.uuid4().hex}", pod, prompt="x" * 300_000, tenant="hostile")
    before = [_request(f"before-{i}-{uuid.uuid4().hex}", pod, tenant="other") for i in range(5)]
    after = [_request(f"after-{i}-{uuid.uuid4().hex}", pod, tenant="other") for i in range(20)]

    def small_batches(names: Names) -> dict[str, int]:
        return {**_large_records(names), names.batches_topic: 100_000}

    async with _running_batcher(slots=64, max_message_bytes=small_batches) as (names, producer, redis, _, loop):
        pubsub = redis.pubsub()
        await pubsub.subscribe(constants.replies_channel(pod))
        await _send_all(producer, names.request_topics[0], [refused, *before])  # one batch, bisected
        await _send_all(producer, names.request_topics[0], after)
        wanted = {r.request_id for r in before + after}
        seen = await _read_until(names.batches_topic, lambda b: [r.request_id for r in b.requests], wanted)
        answers = await _read_until(names.results_topic, lambda r: [r.request_id], {refused.request_id})
        reply = await _next_message(pubsub, timeout_s=10)
    assert wanted <= seen.keys() and refused.request_id not in seen
    ((result, _),) = answers[refused.request_id]
    assert result.outcome is wire.Outcome.ERRORED and not result.error.retryable
    assert (result.error.type, result.error.code) == ("invalid_request_error", "request_too_large")
    assert reply is not None and wire.decode(reply["data"]).request_id == refused.request_id
    assert loop.policy.queued_total == 0

"""Kafka reply topics against the real stack (issue 12 item 4): a reply topic that is reserved, internal or missing
never wedges a result-router partition. Refused topics are answered ``errored`` at entry and dead-lettered; a missing
one is dead-lettered after a few tries while the results behind it, a batch job's included, keep flowing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from llmq_core import constants, ids, kafka, wire
from llmq_core.settings import Settings
from tests import ports
from tests.builders import kafka_request
from tests.stacks import sim_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LLMQ = Path(sys.executable).parent / "llmq"  # the README's .venv/bin/llmq
API_PORT = ports.block()
API_KEY = "llmq-dev-key"  # tenant "dev"
RESERVED = ["__consumer_offsets", "llmq.batches", "llmq.results", "llmq.requests.interactive"]
GUARDED = [constants.TOPIC_BATCHES, constants.TOPIC_RESULTS, *constants.REQUEST_TOPICS]


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    env = {"LLMQ_FILES_URL": str(tmp_path_factory.mktemp("reply-files")), "LLMQ_ROUTER_REPLY_BACKOFF_MS": "200"}
    with sim_stack(infra, (API_PORT,), batch_time_ms=100, extra_env=env) as running:
        yield running


@pytest.fixture
async def kafka_clients(stack):
    settings = Settings(kafka={"bootstrap_servers": stack.cfg.kafka_bootstrap})
    producer = kafka.make_producer(settings)
    reader = AIOKafkaConsumer(bootstrap_servers=stack.cfg.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    await producer.start()
    await reader.start()
    try:
        yield settings, producer, reader
    finally:
        await producer.stop()
        await reader.stop()


async def produce(producer, req: wire.GenerationRequest) -> None:
    await kafka.send_message(
        producer,
        constants.requests_topic(req.traffic_class),
        req,
        key=req.request_id,
        content_type=constants.CONTENT_TYPE_JSON,
    )


async def ends(producer, reader: AIOKafkaConsumer, topics: list[str]) -> dict[TopicPartition, int]:
    """The current end offset of every partition of ``topics``."""
    tps = [TopicPartition(t, p) for t in topics for p in sorted(await producer.partitions_for(t))]
    return await reader.end_offsets(tps)


async def read_from(reader: AIOKafkaConsumer, start: dict[TopicPartition, int], done, timeout_s: float) -> list:
    """Records from ``start`` on until ``done(records)`` (or, with ``done`` None, up to the current ends)."""
    reader.assign(list(start))
    for tp, offset in start.items():
        reader.seek(tp, offset)
    stop = await reader.end_offsets(list(start)) if done is None else None
    records, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for batch in (await reader.getmany(timeout_ms=200)).values():
            records += batch
        if done(records) if done is not None else await caught_up(reader, stop):
            return records
    raise AssertionError(f"gave up after {timeout_s} s with {len(records)} records")


async def caught_up(reader: AIOKafkaConsumer, ends_: dict[TopicPartition, int]) -> bool:
    for tp, end in ends_.items():
        if await reader.position(tp) < end:
            return False
    return True


def producer_id(record) -> str:
    """The producer's own request id of a record keyed by llmq's (tenant-scoped) one."""
    return ids.producer_request_id(record.key.decode())


def dead_letters_for(request_ids: set[str]):
    return lambda records: request_ids <= {producer_id(r) for r in records if r.key}


async def test_the_broker_does_not_create_topics_on_demand(kafka_clients):
    settings, _, _ = kafka_clients
    producer = kafka.make_producer(settings, request_timeout_ms=1000)
    await producer.start()
    try:
        with pytest.raises(KafkaError):
            await producer.send_and_wait(f"test.nobody.{uuid.uuid4().hex[:8]}", b"x")
    finally:
        await producer.stop()


async def test_reserved_reply_topics_are_refused_at_entry_and_the_next_request_is_answered(kafka_clients):
    settings, producer, reader = kafka_clients
    tag = uuid.uuid4().hex[:8]
    good_topic = f"test.replies.{tag}"
    assert await kafka.create_topic(settings, good_topic)
    refused = {f"refused-{tag}-{i}": topic for i, topic in enumerate(RESERVED)}
    guarded = await ends(producer, reader, GUARDED)
    dead = await ends(producer, reader, [constants.TOPIC_DEAD_LETTERS])
    for request_id, topic in refused.items():
        await produce(producer, kafka_request(request_id, topic))
    await produce(producer, kafka_request(f"good-{tag}", good_topic))

    [reply] = await read_from(reader, {TopicPartition(good_topic, 0): 0}, lambda records: records, 60)
    assert json.loads(reply.value)["request_id"] == f"good-{tag}"
    letters = {producer_id(r): r for r in await read_from(reader, dead, dead_letters_for(set(refused)), 30)}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{API_PORT}", headers={"authorization": f"Bearer {API_KEY}"}
    ) as http:
        for request_id, topic in refused.items():
            headers = dict(letters[request_id].headers)
            assert headers[constants.HEADER_REPLY_TOPIC] == topic.encode()
            assert repr(topic).encode() in headers[constants.HEADER_ERROR]
            body = (await http.get(f"/v1/requests/{request_id}")).json()
            assert body["status"] == "errored", body
            assert (body["error"]["code"], body["error"]["param"]) == ("invalid_reply_topic", "reply_to.topic")
    # Nothing but the requests themselves and their one errored answer reached llmq's own topics.
    keys = [(r.topic, producer_id(r)) for r in await read_from(reader, guarded, None, 30) if r.key]
    for request_id in refused:
        assert sorted(t for t, k in keys if k == request_id) == [
            constants.requests_topic("interactive"),
            constants.TOPIC_RESULTS,
        ], request_id


async def test_a_missing_reply_topic_is_dead_lettered_and_the_results_behind_it_flow(stack, kafka_clients):
    settings, producer, reader = kafka_clients
    tag = uuid.uuid4().hex[:8]
    good_topic = f"test.replies.{tag}"
    await kafka.create_topic(settings, good_topic)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{API_PORT}/v1", api_key=API_KEY, max_retries=0)
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "llmq-sim", "prompt": f"line {i}", "max_tokens": 4},
            }
        )
        + "\n"
        for i in range(40)
    )
    upload = await client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
    dead = await ends(producer, reader, [constants.TOPIC_DEAD_LETTERS])
    # One poison per llmq.results partition (each to its own missing topic), and a good result behind the first.
    partitions = sorted(await producer.partitions_for(constants.TOPIC_RESULTS))
    poison = {partition_id(f"poison-{tag}", p, partitions): f"test.missing.{tag}.{p}" for p in partitions}
    good = partition_id(f"good-{tag}", 0, partitions)
    started = time.monotonic()
    for request_id, topic in poison.items():
        await produce(producer, kafka_request(request_id, topic))
    await produce(producer, kafka_request(good, good_topic))
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")

    [reply] = await read_from(reader, {TopicPartition(good_topic, 0): 0}, lambda records: records, 60)
    assert json.loads(reply.value)["request_id"] == good
    letters = {producer_id(r): r for r in await read_from(reader, dead, dead_letters_for(set(poison)), 60)}
    elapsed_s = time.monotonic() - started
    for request_id, topic in poison.items():
        headers = dict(letters[request_id].headers)
        assert headers[constants.HEADER_REPLY_TOPIC] == topic.encode()
        assert b"does not exist" in headers[constants.HEADER_ERROR]
    assert elapsed_s < 30, f"dead-lettering took {elapsed_s:.1f} s"
    deadline = time.monotonic() + 90
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, f"batch stuck at {batch.request_counts}"
        await asyncio.sleep(0.5)
        batch = await client.batches.retrieve(batch.id)
    assert (batch.status, batch.request_counts.completed, batch.request_counts.total) == ("completed", 40, 40)


async def test_fresh_missing_reply_topics_are_dead_lettered_at_once_and_hold_up_no_good_reply(stack, kafka_clients):
    """FINDINGS 4: each missing topic with a new name used to hold its partition ~6 s (16 names: 27 s)."""
    settings, producer, reader = kafka_clients
    tag = uuid.uuid4().hex[:8]
    good_topic = f"test.replies.{tag}"
    await kafka.create_topic(settings, good_topic)
    await produce(producer, kafka_request(f"warm-{tag}", good_topic))  # the stack answers Kafka replies at all
    await read_from(reader, {TopicPartition(good_topic, 0): 0}, lambda records: records, 60)
    dead = await ends(producer, reader, [constants.TOPIC_DEAD_LETTERS])
    partitions = sorted(await producer.partitions_for(constants.TOPIC_RESULTS))
    poison = {partition_id(f"fresh-{tag}-{i}", 0, partitions): f"test.missing.{tag}.{i}" for i in range(16)}
    for request_id, topic in poison.items():  # all on the good reply's llmq.results partition, ahead of it
        await produce(producer, kafka_request(request_id, topic))
    good = partition_id(f"good-{tag}", 0, partitions)
    started = time.monotonic()
    await produce(producer, kafka_request(good, good_topic))

    def answered(records):
        return any(json.loads(r.value)["request_id"] == good for r in records)

    await read_from(reader, {TopicPartition(good_topic, 0): 0}, answered, 30)
    elapsed_s = time.monotonic() - started
    letters = {producer_id(r): r for r in await read_from(reader, dead, dead_letters_for(set(poison)), 30)}
    assert elapsed_s < 3, f"the good reply took {elapsed_s:.1f} s"
    for request_id, topic in poison.items():
        headers = dict(letters[request_id].headers)
        assert headers[constants.HEADER_REPLY_TOPIC] == topic.encode()
        assert b"does not exist" in headers[constants.HEADER_ERROR]


def partition_id(prefix: str, partition: int, partitions: list[int]) -> str:
    """A request id whose results land on ``partition`` of llmq.results (workers key results by request id)."""
    for i in range(10_000):
        candidate = f"{prefix}-{i}"
        if DefaultPartitioner()(candidate.encode(), partitions, partitions) == partition:
            return candidate
    raise AssertionError("no id found")


async def test_the_documented_create_topic_command_makes_a_reply_topic_that_fits_any_result(stack, kafka_clients):
    settings, producer, _ = kafka_clients
    topic = f"test.cli-replies.{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LLMQ_KAFKA_BOOTSTRAP_SERVERS": stack.cfg.kafka_bootstrap}
    command = [str(LLMQ), "dev", "create-topic", topic, "--partitions", "2"]
    created = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=60)
    again = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=60)
    assert created.returncode == 0 and "created" in created.stdout, created.stdout + created.stderr
    assert again.returncode == 0 and "exists already" in again.stdout
    assert await producer.partitions_for(topic) == {0, 1}
    big = b"x" * (constants.MAX_RESULT_BYTES + constants.RECORD_HEADROOM_BYTES)  # past a broker's 1 MB default
    big_producer = kafka.make_producer(settings, max_request_size=constants.KAFKA_MAX_MESSAGE_BYTES)
    await big_producer.start()
    try:
        await big_producer.send_and_wait(topic, big)
    finally:
        await big_producer.stop()

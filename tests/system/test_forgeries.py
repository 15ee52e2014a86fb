"""Forgeries against a real secure stack (issue 16, items 2, 3 and 5), each by a principal the ACLs let do the
transport-level act, so what refuses it is the application's own check: a reply PUBLISHed on an API pod's channel with
the worker's Redis credentials, naming another tenant, is dropped and the real answer still arrives; a final_result for
another tenant's batch line produced to llmq.results with the worker's Kafka credentials changes nothing; a record a
Kafka-direct producer writes on its own ingress topic (as its own SCRAM user) claiming another tenant is answered
errored. Each forgery is counted in /metrics."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import httpx
import msgspec
import openai
import pytest
from aiokafka import TopicPartition

from llmq_core import constants, kafka, wire
from llmq_core.redis_client import make_redis
from llmq_core.security import ROLE_ADMIN, ROLE_WORKER
from llmq_core.status import ErrorCode
from llmq_jobs import jobs
from tests import ports
from tests.builders import kafka_request
from tests.infra import SECURE_INGRESS_PRINCIPALS, SECURE_REPLY_TOPIC_PREFIXES
from tests.stacks import private_stack
from tests.system.test_reply_topics import read_from

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_PORT = ports.block()  # metrics: result-router +10, batcher +11, worker +12, API pod +13
BATCH_TIME_MS = 800  # long enough to forge a reply while the real one is still being generated
PRINCIPAL = SECURE_INGRESS_PRINCIPALS[0]  # the secure infra gives it a SCRAM user that writes its ingress topic only
OWN_REPLIES = (
    f"{SECURE_REPLY_TOPIC_PREFIXES[0]}acme."  # the ingress producer's reply topics: its prefix of the router's
)
INGRESS = {PRINCIPAL: {"tenant_id": "acme", "classes": ["interactive"], "reply_topic_prefixes": [OWN_REPLIES]}}
DEV = {"authorization": "Bearer llmq-dev-key"}


@pytest.fixture(scope="module")
def stack(secure_infra, tmp_path_factory):
    # Secure clusters: only the admin creates topics, the ingress principal's among them (the batcher reads it).
    asyncio.run(kafka.ensure_topics(secure_infra.cfg.settings(ROLE_ADMIN).replace(kafka={"ingress": INGRESS})))
    env = {"LLMQ_FILES_URL": str(tmp_path_factory.mktemp("forgery-files")), "LLMQ_KAFKA_INGRESS": json.dumps(INGRESS)}
    with private_stack(
        secure_infra,
        api_ports=(API_PORT,),
        tiny_workers=0,
        sim_workers=1,
        sim_batch_time_ms=BATCH_TIME_MS,
        extra_env={**secure_infra.cfg.extra_env, **env},
    ) as running:
        yield running


async def metric(stack, service: str, name: str, labels: str = "") -> float:
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(stack.metrics_urls()[service])).text
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, flags=re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_reply_naming_another_tenant_is_dropped_and_the_real_answer_arrives(stack):
    redis = make_redis(stack.cfg.settings(ROLE_WORKER))  # a worker may PUBLISH on every pod's replies channel
    body = {"model": "llmq-sim", "prompt": "real ", "max_tokens": 10, "stream": True}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{API_PORT}", headers=DEV, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                request_id = response.headers["x-request-id"]
                channel = constants.replies_channel(stack.cfg.instance_id("api-0"))
                forged = wire.FinalResult(
                    request_id=request_id,
                    tenant_id="mallory",
                    outcome=wire.Outcome.SUCCEEDED,
                    model="llmq-sim",
                    reply_to=wire.HttpReply(instance_id=stack.cfg.instance_id("api-0")),
                    choices=[wire.Choice(index=0, text="FORGED", finish_reason="stop")],
                )
                chunk = wire.TokenChunk(request_id=request_id, text="FORGED", seq=0, sent_ms=0, tenant_id="mallory")
                assert await redis.publish(channel, wire.encode(chunk)) == 1  # the pod is subscribed
                assert await redis.publish(channel, wire.encode(forged)) == 1
                frames = [line.removeprefix("data: ") async for line in response.aiter_lines() if line]
    finally:
        await redis.aclose()
    assert frames[-1] == "[DONE]"
    text = "".join(choice["text"] for frame in frames[:-1] for choice in json.loads(frame)["choices"])
    assert text == "real real "  # llmq-sim repeats the prompt; nothing of the forgeries
    assert await metric(stack, "api-0", "llmq_api_forged_replies_total", '{region="local"}') >= 2


async def test_a_forged_final_result_for_another_tenants_batch_line_has_no_effect(stack):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{API_PORT}/v1", api_key="llmq-dev-key", max_retries=0)
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions"}
    line["body"] = {"model": "llmq-sim", "prompt": "own ", "max_tokens": 8}
    uploaded = await client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    forged = wire.FinalResult(
        request_id=jobs.line_request_id(batch.id, "c1"),  # the id llmq derives: right batch, line and round
        tenant_id="mallory",
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=wire.JobReply(batch_id=batch.id, custom_id="c1"),
        choices=[wire.Choice(index=0, text="FORGED", finish_reason="stop")],
    )
    producer = kafka.make_producer(stack.cfg.settings(ROLE_WORKER))  # a worker may write llmq.results
    await producer.start()
    try:  # long before the line's own result: it is queued as deferred work, then generated for BATCH_TIME_MS
        await kafka.send_message(producer, constants.TOPIC_RESULTS, forged, key=forged.request_id)
    finally:
        await producer.stop()
    deadline = time.monotonic() + 60
    while (batch := await client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        await asyncio.sleep(0.25)
    output = [json.loads(x) for x in (await client.files.content(batch.output_file_id)).text.splitlines()]
    await client.close()
    assert batch.status == "completed" and len(output) == 1
    assert output[0]["response"]["body"]["choices"][0]["text"] == "own own "  # llmq-sim repeats the prompt
    labels = '{reason="other_tenant",region="local"}'
    assert await metric(stack, "result-router", "llmq_router_forged_results_total", labels) >= 1


async def test_an_ingress_record_claiming_another_tenant_or_topic_is_errored_and_its_own_tenant_runs(stack):
    """Issue 34 item 1: an ingress record naming another tenant's reply topic had its answer written there."""
    admin = stack.cfg.settings(ROLE_ADMIN)
    tag = uuid.uuid4().hex[:8]
    reply_topic, others_topic = f"{OWN_REPLIES}{tag}", f"{SECURE_REPLY_TOPIC_PREFIXES[0]}beta.{tag}"
    for topic in (reply_topic, others_topic):  # both where the router may write replies
        assert await kafka.create_topic(admin, topic)
    base = kafka_request("", reply_topic, tenant_id="acme", prompt="ingress ")
    claims = msgspec.structs.replace(base, request_id=f"claim-{tag}", tenant_id="victim")
    squats = msgspec.structs.replace(base, request_id=f"squat-{tag}", reply_to=wire.KafkaReply(topic=others_topic))
    own = msgspec.structs.replace(base, request_id=f"own-{tag}")
    producer = kafka.make_producer(stack.cfg.settings(PRINCIPAL))  # the ingress principal's own SCRAM user
    reader = kafka.make_consumer(admin, group_id=None)
    await producer.start()
    await reader.start()
    try:
        for request in (claims, squats, own):
            await kafka.send_message(
                producer,
                constants.ingress_topic(PRINCIPAL),
                request,
                key=request.request_id,
                content_type=constants.CONTENT_TYPE_JSON,
            )
        records = await read_from(reader, {TopicPartition(reply_topic, 0): 0}, lambda rs: len(rs) >= 2, 30)
        dead = await read_from(
            reader,
            {TopicPartition(constants.TOPIC_DEAD_LETTERS, 0): 0},
            lambda rs: any(r.key == squats.request_id.encode() for r in rs),
            30,
        )  # the router's answer to the squat: dead-lettered as the producer would have read it (its own request id),
        # never produced to beta's topic
        others = await reader.end_offsets([TopicPartition(others_topic, 0)])
    finally:
        await producer.stop()
        await reader.stop()
    results = {r["request_id"]: r for r in (msgspec.json.decode(record.value) for record in records)}
    assert set(results) == {claims.request_id, own.request_id}  # the producer's own ids, nothing else
    refused = results[claims.request_id]
    assert (refused["outcome"], refused["error"]["code"], refused["tenant_id"]) == (
        "errored",
        ErrorCode.TENANT_NOT_ALLOWED,
        "acme",
    )
    assert results[own.request_id]["outcome"] == "succeeded"
    assert list(others.values()) == [0] and dead
    for reason in (ErrorCode.TENANT_NOT_ALLOWED, ErrorCode.INVALID_REPLY_TOPIC):
        labels = f'{{reason="{reason}",region="local"}}'
        assert await metric(stack, "batcher", "llmq_batcher_ingress_refused_total", labels) == 1

"""Requests produced straight to Kafka against the real stack (issue 13, items 7 and 9): a faulty one is answered at
once on its reply topic with the error object the API answers the same body with; a deadline beyond its class's
maximum is clamped; a re-produced request_id gets its stored result again, or, once that expired, errored
``request_id_reused`` naming it (both used to wait for the deadline or get nothing at all)."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types.chat import ChatCompletion

from llmq_core import constants, ids, kafka, wire
from llmq_core.redis_client import make_redis
from llmq_core.settings import Settings
from tests import ports
from tests.stacks import sim_stack
from tests.system.test_reply_topics import produce, read_from

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_PORT = ports.block()
MAX_TIMEOUT_MS = 3000  # interactive maximum in this stack: a clamped deadline shows within seconds
RESULT_TTL_S = 2  # stored results expire within the test; request ids stay claimed for a day


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    env = {
        "LLMQ_FILES_URL": str(tmp_path_factory.mktemp("direct-files")),
        "LLMQ_API_INTERACTIVE_MAX_TIMEOUT_MS": str(MAX_TIMEOUT_MS),
        "LLMQ_RESULT_STORE_TTL_S": str(RESULT_TTL_S),
    }
    with sim_stack(infra, (API_PORT,), batch_time_ms=100, extra_env=env) as running:
        yield running


@pytest.fixture
async def clients(stack):
    settings = Settings(kafka={"bootstrap_servers": stack.cfg.kafka_bootstrap}, redis={"url": stack.cfg.redis_url})
    topic = f"test.direct.{uuid.uuid4().hex[:8]}"
    assert await kafka.create_topic(settings, topic)
    producer = kafka.make_producer(settings)
    reader = AIOKafkaConsumer(bootstrap_servers=stack.cfg.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    redis = make_redis(settings)
    await producer.start()
    await reader.start()
    try:
        yield topic, producer, reader, redis
    finally:
        await producer.stop()
        await reader.stop()
        await redis.aclose()


def direct(request_id: str, topic: str, body: dict, deadline_in_ms: int = 60_000) -> wire.GenerationRequest:
    """``body`` (an OpenAI completions body) as a JSON GenerationRequest produced straight to Kafka."""
    now_ms = int(time.time() * 1000)
    sampling = {k: body[k] for k in ("max_tokens", "temperature") if k in body}
    return wire.GenerationRequest(
        request_id=request_id,
        tenant_id="dev",
        model=body["model"],
        prompt=body["prompt"],
        sampling=wire.SamplingParams(**sampling),
        created_ms=now_ms,
        deadline_ms=now_ms + deadline_in_ms,
        reply_to=wire.KafkaReply(topic=topic),
    )


async def replies(reader: AIOKafkaConsumer, topic: str, count: int, timeout_s: float = 15) -> list[dict]:
    records = await read_from(reader, {TopicPartition(topic, 0): 0}, lambda rs: len(rs) >= count, timeout_s)
    return [msgspec.json.decode(r.value) for r in records]


async def test_faulty_requests_get_the_http_error_at_once_and_deadlines_are_clamped(clients):
    topic, producer, reader, _ = clients
    bodies = {
        "unknown-model": {"model": "no-such-model", "prompt": "hi", "max_tokens": 4},
        "hot": {"model": "llmq-sim", "prompt": "hi", "max_tokens": 4, "temperature": 9},
    }
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{API_PORT}/v1", timeout=10, headers={"Authorization": "Bearer llmq-dev-key"}
    ) as http:
        errors = {name: (await http.post("/completions", json=body)).json()["error"] for name, body in bodies.items()}
    tag = uuid.uuid4().hex[:8]
    for name, body in bodies.items():
        await produce(producer, direct(f"{name}-{tag}", topic, body, deadline_in_ms=86_400_000))
    # llmq-tiny has no worker here: only the clamp to the class maximum (3 s, not a day) can end it
    await produce(producer, direct(f"far-{tag}", topic, {"model": "llmq-tiny", "prompt": "hi"}, 86_400_000))
    started = time.monotonic()
    got = {r["request_id"].rsplit("-", 1)[0]: r for r in await replies(reader, topic, 3)}
    assert time.monotonic() - started < 10
    for name, error in errors.items():
        assert got[name]["outcome"] == "errored"
        assert {k: got[name]["error"][k] for k in error} == error  # message, type, param, code
    assert got["unknown-model"]["error"]["code"] == "model_not_found" and got["hot"]["error"]["param"] == "temperature"
    assert got["far"]["outcome"] == "expired"
    assert got["far"]["finished_ms"] - got["far"]["created_ms"] < MAX_TIMEOUT_MS + 2000


async def test_a_reproduced_request_id_gets_its_stored_result_again_then_request_id_reused(clients):
    topic, producer, reader, redis = clients
    request = direct(f"again-{uuid.uuid4().hex[:8]}", topic, {"model": "llmq-sim", "prompt": "hello", "max_tokens": 4})
    await produce(producer, request)
    (first,) = await replies(reader, topic, 1)
    await produce(producer, request)  # the same id again, the first one finished: its stored result
    first_again, replay = await replies(reader, topic, 2)
    assert first["outcome"] == "succeeded" and replay["choices"] == first["choices"] and replay["request_copy"]
    deadline = time.monotonic() + 10
    stored_key = constants.result_key(ids.tenant_scoped_id(request.tenant_id, request.request_id))
    while await redis.exists(stored_key):  # the stored result expires (TTL 2 s)
        assert time.monotonic() < deadline, "the stored result did not expire"
        await reader.getmany(timeout_ms=200)
    await produce(producer, request)
    reused = (await replies(reader, topic, 3))[2]
    assert (reused["outcome"], reused["error"]["code"]) == ("errored", "request_id_reused")
    assert repr(request.request_id) in reused["error"]["message"]


async def test_a_record_past_int64_is_dead_lettered_and_its_neighbours_in_the_fetch_are_answered(clients, stack):
    """QA finding 1: the tester's record (``attempt`` of 2**64) used to restart the batcher's consume pass, dropping
    the valid records fetched with it (never answered) and freezing the group's committed offset."""
    topic, producer, reader, _ = clients
    tag, now_ms = uuid.uuid4().hex[:8], int(time.time() * 1000)
    ids = [f"nb-{tag}-{i}" for i in range(4)]
    headers = [(constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_JSON.encode())]
    batch = producer.create_batch()
    for i, request_id in enumerate(ids):
        poison = ',"attempt":18446744073709551616' if i == 0 else ""
        value = (
            f'{{"type":"generation_request","request_id":"{request_id}","tenant_id":"dev","created_ms":{now_ms},'
            f'"deadline_ms":{now_ms + 60_000},"reply_to":{{"kind":"kafka","topic":"{topic}"}},'
            f'"model":"llmq-sim","prompt":"hi","sampling":{{"max_tokens":4}}{poison}}}'
        ).encode()
        batch.append(key=request_id.encode(), value=value, timestamp=None, headers=headers)
    interactive = constants.requests_topic(constants.INTERACTIVE)
    meta = await (await producer.send_batch(batch, interactive, partition=0))  # one fetch holds all four
    answered = {r["request_id"]: r["outcome"] for r in await replies(reader, topic, 3)}
    assert answered == dict.fromkeys(ids[1:], "succeeded")
    tp = TopicPartition(interactive, 0)
    dead = await read_from(
        reader,
        {
            TopicPartition(constants.TOPIC_DEAD_LETTERS, p): 0
            for p in await producer.partitions_for(constants.TOPIC_DEAD_LETTERS)
        },
        None,
        15,
    )
    (reason,) = [dict(r.headers)[constants.HEADER_ERROR] for r in dead if r.key == ids[0].encode()]
    assert b"$.attempt" in reason
    group = AIOKafkaConsumer(
        bootstrap_servers=stack.cfg.kafka_bootstrap, group_id=constants.GROUP_BATCHER, enable_auto_commit=False
    )
    await group.start()
    try:  # no subscribe: reads the batcher group's commits without joining it
        deadline = time.monotonic() + 10
        while (await group.committed(tp) or 0) < meta.offset + 4:
            assert time.monotonic() < deadline, "the batcher's committed offset did not pass the four records"
            await reader.getmany(timeout_ms=200)
    finally:
        await group.stop()


async def test_a_record_with_an_http_reply_gets_the_checks(clients):
    """QA finding 5: a record with an ``http`` reply skipped every check (1000 choices, temperature -5 were served)."""
    _, producer, _, _ = clients
    now_ms = int(time.time() * 1000)
    bad = wire.GenerationRequest(
        request_id=f"http-{uuid.uuid4().hex[:8]}",
        tenant_id="dev",
        model="llmq-sim",
        prompt="hi",
        sampling=wire.SamplingParams(max_tokens=4, n=1000, temperature=-5, top_p=7),
        created_ms=now_ms,
        deadline_ms=now_ms + 60_000,
        reply_to=wire.HttpReply(instance_id="api-nobody"),
    )
    await produce(producer, bad)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{API_PORT}/v1", timeout=10, headers={"Authorization": "Bearer llmq-dev-key"}
    ) as http:
        deadline = time.monotonic() + 15
        while (got := await http.get(f"/requests/{bad.request_id}")).status_code == 404:  # not finished yet
            assert time.monotonic() < deadline, got.text
            await asyncio.sleep(0.2)
    body = got.json()
    assert body["status"] == "errored", body
    assert (body["error"]["code"], body["error"]["param"]) == ("out_of_range", "temperature")


async def test_a_reproduced_request_id_with_other_parameters_is_errored_request_id_reused(clients):
    """QA finding 8: a copy with another prompt silently got the first request's result."""
    topic, producer, reader, _ = clients
    request = direct(f"diff-{uuid.uuid4().hex[:8]}", topic, {"model": "llmq-sim", "prompt": "hi", "max_tokens": 4})
    await produce(producer, request)
    await replies(reader, topic, 1)
    other = msgspec.structs.replace(request, prompt="DIFFERENT", sampling=wire.SamplingParams(max_tokens=9))
    await produce(producer, other)
    await produce(producer, request)  # a true repeat still gets the stored result
    first, differs, repeat = await replies(reader, topic, 3)
    error = differs["error"]
    assert (differs["outcome"], error["code"], error["param"]) == ("errored", "request_id_reused", "request_id")
    assert "different parameters" in error["message"] and not differs["choices"]
    assert repeat["outcome"] == "succeeded" and repeat["choices"] == first["choices"] and repeat["request_copy"]


async def test_a_producer_gets_its_reply_in_openais_or_anthropics_format(clients):
    """Issue 32 item 5: ``reply_to.body: api`` answers with the request's ``api_format``'s batch result line (the
    shapes the SDKs parse), under the producer's own id; a chat in Anthropic's format gets its Message Batch line."""
    topic, producer, reader, _ = clients
    tag = uuid.uuid4().hex[:8]
    now_ms = int(time.time() * 1000)
    reply = wire.KafkaReply(topic=topic, body=constants.REPLY_BODY_API)
    chat = wire.GenerationRequest(
        request_id=f"chat-{tag}",
        tenant_id="dev",
        model="llmq-sim",
        endpoint="chat.completions",
        messages=[wire.ChatMessage(role="user", content="hello")],
        sampling=wire.SamplingParams(max_tokens=4),
        created_ms=now_ms,
        deadline_ms=now_ms + 60_000,
        reply_to=reply,
    )
    await produce(producer, chat)
    await produce(producer, msgspec.structs.replace(chat, request_id=f"msg-{tag}", api_format=constants.ANTHROPIC))
    got = {line.get("custom_id"): line for line in await replies(reader, topic, 2)}
    openai_line = got[f"chat-{tag}"]
    assert openai_line["response"]["status_code"] == 200
    ChatCompletion.model_validate(openai_line["response"]["body"])
    anthropic_line = MessageBatchIndividualResponse.model_validate(got[f"msg-{tag}"])
    assert anthropic_line.result.type == "succeeded" and anthropic_line.result.message.usage.output_tokens == 4

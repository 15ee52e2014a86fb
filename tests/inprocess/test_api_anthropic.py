"""Anthropic's Messages API of a pod against the suite's real Kafka and Redis, through the official SDK (anthropic
2.15), answered by test_api.py's fake worker (it replays the last message): the one request path, seen from Kafka."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest

from llmq_core import constants
from tests.inprocess.test_api import (
    MODEL,
    _eventually,
    _next_cancel,
    heartbeat,
    stack,  # noqa: F401 (a fixture: the module's pod, fake worker and Redis)
)

pytestmark = pytest.mark.integration

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture
def messages_api(stack):  # noqa: F811 (the fixture imported above)
    stack[1].catalog.observe(heartbeat(MODEL))  # the pod learns the test's model in-process only
    return stack


def sdk(base_url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="llmq-dev-key", max_retries=0, timeout=30)


async def test_a_message_and_a_stream_through_kafka(messages_api):
    base_url, pod, worker, _ = messages_api
    async with sdk(base_url) as client:
        message = await client.messages.create(
            model=MODEL, max_tokens=6, messages=USER, extra_headers={"x-llmq-class": "near_interactive"}
        )
        async with client.messages.stream(model=MODEL, max_tokens=7, messages=USER) as stream:
            streamed = "".join([text async for text in stream.text_stream])
            final = await stream.get_final_message()
    assert message.content[0].text == "helloh" and message.stop_reason == "max_tokens"
    request, record = worker.seen[message.id]
    assert record.topic == constants.requests_topic("near_interactive") and record.key == message.id.encode()
    assert request.api_format == constants.ANTHROPIC and message.usage.input_tokens == request.prompt_tokens
    assert streamed == final.content[0].text == "hellohe" and worker.seen[final.id][0].stream
    assert message.id not in pod.registry and final.id not in pod.registry


async def test_a_stream_whose_client_leaves_is_canceled(messages_api):
    base_url, pod, worker, redis = messages_api
    cancels = redis.pubsub()
    await cancels.subscribe(constants.REDIS_CANCELS_CHANNEL)
    await cancels.get_message(timeout=1)
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "silent"}]}
    headers = {"x-api-key": "llmq-dev-key", "anthropic-version": "2023-06-01"}
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as client:
            call = asyncio.create_task(client.post("/v1/messages", json=body))
            await _eventually(lambda: any(r.request_id in pod.registry for r, _ in worker.seen.values()))
            (request_id,) = pod.registry.request_ids()
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        assert (await _next_cancel(cancels, request_id)).reason == "client_disconnected"
    finally:
        await cancels.aclose()

"""The whole stack as real processes: two API pods, batcher, workers (llmq-sim x2, llmq-tiny), result-router, in
secure mode (``llmq dev up --secure``: Kafka SASL_SSL with per-role principals and ACLs, Redis TLS with ACL users).

Clients are real: the official ``openai`` SDK over HTTP, and ``kcat`` producing JSON straight to Kafka (as the admin
principal, over mTLS).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

import httpx
import openai
import pytest
from aiokafka import TopicPartition

from llmq_bench.prompts import cut_prompts
from llmq_core import wire
from llmq_core.constants import MAX_RESULT_BYTES, TOPIC_RESULTS, requests_topic
from llmq_core.kafka import make_consumer
from llmq_core.tokenizer import count_tokens
from tests import ports
from tests.stacks import kcat_request, private_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ports.block()  # the metrics ports derived from the API ports (+10 and up) are free too
API_PORTS = (BASE, BASE + 1)


def sim_answer(prompt: str, max_tokens: int) -> str:
    """llmq-sim's completion: the prompt's own bytes from its start, cycled, ``max_tokens`` of them (UTF-8 safe)."""
    data = prompt.encode()
    out = bytes(data[i % len(data)] for i in range(max_tokens))
    return out.decode("utf-8", errors="ignore")


@pytest.fixture(scope="module")
def stack(secure_infra):
    with private_stack(secure_infra, api_ports=API_PORTS, sim_batch_time_ms=300) as running:
        yield running


def clients() -> list[openai.AsyncOpenAI]:
    return [
        openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="llmq-dev-key", max_retries=0, timeout=120)
        for port in API_PORTS
    ]


async def test_200_concurrent_requests_each_get_their_own_answer(stack):
    pods = clients()
    prompts = cut_prompts(200, seed=7, max_chars=600)

    async def ask(i, p):
        return await pods[i % 2].completions.create(model="llmq-sim", prompt=p.prompt, max_tokens=p.max_tokens)

    responses = await asyncio.gather(*(ask(i, p) for i, p in enumerate(prompts)))
    ids = set()
    for p, response in zip(prompts, responses):
        assert response.choices[0].text == sim_answer(p.prompt, p.max_tokens)
        assert response.usage.prompt_tokens == count_tokens(p.prompt)
        assert response.usage.completion_tokens == p.max_tokens
        ids.add(response.id)
    assert len(ids) == len(prompts)


async def test_chat_on_llmq_sim_replays_the_last_user_message(stack):
    pod = clients()[1]
    response = await pod.chat.completions.create(
        model="llmq-sim",
        max_tokens=7,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
    )
    assert response.choices[0].message.content == "hellohe"
    assert response.choices[0].message.role == "assistant"


async def test_llmq_tiny_answers_are_well_formed(stack):
    pods = clients()
    prompts = cut_prompts(8, seed=3, max_chars=800)
    responses = await asyncio.gather(
        *(
            pods[i % 2].completions.create(model="llmq-tiny", prompt=p.prompt, max_tokens=12, temperature=0)
            for i, p in enumerate(prompts)
        )
    )
    for p, response in zip(prompts, responses):
        choice = response.choices[0]
        assert isinstance(choice.text, str) and "\ufffd" not in choice.text
        assert choice.finish_reason in ("stop", "length")
        assert response.usage.prompt_tokens == count_tokens(p.prompt)
        assert 0 < response.usage.completion_tokens <= 12
        assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


async def test_deadline_ends_in_504_with_an_openai_error(stack):
    pod = clients()[0]
    with pytest.raises(openai.APIStatusError) as caught:
        await pod.completions.create(
            model="llmq-sim", prompt="slow " * 10, max_tokens=8, extra_headers={"x-llmq-timeout-ms": "50"}
        )
    assert caught.value.status_code == 504
    assert caught.value.body["type"]  # OpenAI-style error object: message, type, param, code
    assert "message" in caught.value.body


async def kcat_sim_request(stack, prompt: str, sampling: dict) -> tuple[str, dict]:
    """A llmq-sim completion produced by kcat as JSON with a Kafka reply topic of its own: (request_id, its result)."""
    request_id = f"kcat-{uuid.uuid4().hex[:12]}"
    now_ms = int(__import__("time").time() * 1000)
    request = {
        "type": "generation_request",
        "request_id": request_id,
        "tenant_id": "team-a",
        "model": "llmq-sim",
        "prompt": prompt,
        "sampling": sampling,
        "created_ms": now_ms,
        "deadline_ms": now_ms + 60_000,
        "reply_to": {"kind": "kafka", "topic": f"team.replies.{request_id}"},
    }
    return request_id, await kcat_request(stack, requests_topic("interactive"), request)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by `make test`")
async def test_kcat_request_answered_on_a_kafka_reply_topic(stack):
    request_id, result = await kcat_sim_request(stack, "kafka says hi", {"max_tokens": 20})
    assert result["request_id"] == request_id
    assert result["outcome"] == "succeeded"
    assert result["choices"][0]["text"] == sim_answer("kafka says hi", 20)
    assert result["choices"][0].get("logprobs") is None


async def test_the_issue_12_oversized_request_is_one_outcome_and_kills_no_worker(stack):
    """Issue 12 item 1: n=128 x max_tokens=8190 once killed both llmq-sim workers (a ~1 MB record over the producer's
    limit). Now its HTTP answer is the llmq.results record, within MAX_RESULT_BYTES; the same workers serve on."""

    def sim_workers() -> dict[str, int]:
        return {r["name"]: r["pid"] for r in stack.status() if r["model"] == "llmq-sim" and r["health"] == "healthy"}

    workers = sim_workers()
    settings = stack.cfg.settings()
    log_reader = make_consumer(settings, group_id=None)
    await log_reader.start()
    try:
        partitions = [TopicPartition(TOPIC_RESULTS, p) for p in range(settings.kafka.results_topic_partitions)]
        log_reader.assign(partitions)
        await log_reader.seek_to_end(*partitions)
        for tp in partitions:
            await log_reader.position(tp)
        async with httpx.AsyncClient(timeout=120) as http:
            response = await http.post(
                f"http://127.0.0.1:{API_PORTS[0]}/v1/completions",
                headers={"authorization": "Bearer llmq-dev-key"},
                json={"model": "llmq-sim", "prompt": "x", "max_tokens": 8190, "n": 128},
            )
        assert response.status_code == 200, response.text  # 128 x 8190 bytes fit MAX_RESULT_BYTES: served whole
        body = response.json()
        assert sum(len(c["text"].encode()) for c in body["choices"]) <= MAX_RESULT_BYTES
        assert {c["finish_reason"] for c in body["choices"]} == {"length"}
        async with asyncio.timeout(30):
            logged = None
            while logged is None:
                for records in (await log_reader.getmany(timeout_ms=500)).values():
                    logged = next(
                        (r for r in (wire.decode(rec.value) for rec in records) if r.request_id == body["id"]), logged
                    )
        assert logged.outcome is wire.Outcome.SUCCEEDED
        assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
            (c.index, c.text, c.finish_reason) for c in sorted(logged.choices, key=lambda c: c.index)
        ]
        assert body["usage"]["completion_tokens"] == logged.usage.completion_tokens
    finally:
        await log_reader.stop()
    after = await clients()[0].completions.create(model="llmq-sim", prompt="still here", max_tokens=5)
    assert after.choices[0].text == "still"
    assert sim_workers() == workers  # the same processes, none restarted


async def _chat_logprobs_both_ways(pod: openai.AsyncOpenAI, **params) -> tuple[list, list, str]:
    """(plain entries, streamed entries, text) of one chat asked twice, plain then streamed."""
    plain = await pod.chat.completions.create(**params)
    stream = await pod.chat.completions.create(**params, stream=True)
    streamed, text = [], ""
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                streamed += choice.logprobs.content or []
    assert text == plain.choices[0].message.content
    return plain.choices[0].logprobs.content, streamed, text


async def test_chat_logprobs_through_the_sdk_are_the_same_streamed_and_not_on_llmq_tiny(stack):
    pod = clients()[0]
    messages = [{"role": "user", "content": "héllo wörld"}]
    params = dict(model="llmq-tiny", messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=20)
    plain, streamed, text = await _chat_logprobs_both_ways(pod, **params)
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in plain]
    assert len(plain) >= len(text.encode()) > 0  # byte tokens: one per byte kept, and those dropped as invalid UTF-8
    assert all(len(e.top_logprobs) == 20 and e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob for e in plain)
    assert all(e.logprob <= 0 and e.logprob <= e.top_logprobs[0].logprob + 1e-6 for e in plain)


async def test_completion_logprobs_through_the_sdk_are_the_legacy_lists_streamed_and_not(stack):
    pod = clients()[1]
    params = dict(model="llmq-sim", prompt="ab. cd", max_tokens=6, logprobs=2, stop=[". "])
    plain = (await pod.completions.create(**params)).choices[0]
    assert plain.text == "ab" and plain.logprobs.tokens == ["a", "b"]  # the stop sequence's tokens are left out
    assert plain.logprobs.text_offset == [0, 1] and all(len(top) == 2 for top in plain.logprobs.top_logprobs)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    async for chunk in await pod.completions.create(**params, stream=True):
        for choice in chunk.choices:
            for key in streamed:
                streamed[key] += getattr(choice.logprobs, key) if choice.logprobs else []
    assert streamed == plain.logprobs.model_dump()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by `make test`")
async def test_kcat_request_with_logprobs_gets_its_entries_on_the_reply_topic(stack):
    _, result = await kcat_sim_request(stack, "hé", {"max_tokens": 3, "logprobs": 1})
    (choice,) = result["choices"]
    assert choice["text"] == "hé"
    assert [(e["token"], e["bytes"]) for e in choice["logprobs"]] == [("h", [104]), ("\\xc3", [195]), ("\\xa9", [169])]
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in choice["logprobs"])

"""A real LLM through the whole pipeline: smollm2-135m-instruct (installed by ``make setup``) on one transformers worker
behind two API pods, asked with the openai SDK and httpx.

Each generating request is sent alone (batch composition changes floating-point results) with short ``max_tokens``:
on this CPU the model makes about 13 tokens/s alone, far fewer on a loaded machine.
"""

from __future__ import annotations

import json
import signal
import time
import uuid

import httpx
import msgspec
import openai
import pytest
from redis.asyncio import Redis

from llmq_core import constants, wire
from llmq_core.constants import HTTP_TIMEOUT_MS
from llmq_core.models import SMOLLM2_135M_INSTRUCT
from llmq_core.settings import Settings
from llmq_core.token_counts import TokenizerCounter
from llmq_worker import checkpoints
from tests import ports
from tests.stacks import private_stack
from tests.system.faults.stack import FaultStack
from tests.system.token_bucket import TokenBucket

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long(75)]

# the stack's metrics ports are derived from these (API port + 10 and up): the whole block is allocated
BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
MODEL = SMOLLM2_135M_INSTRUCT.name
TIMEOUT_MS = 180_000  # a loaded 2-core machine can be slow; no test waits this long when it works
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
POEM = "Write a short poem about the sea."
POEM_MAX_TOKENS = 32
QUOTA_TENANT = f"quota-{uuid.uuid4().hex[:8]}"  # the suite's Redis outlives this module: a bucket of its own
KILL_AFTER_CHARS = 12


@pytest.fixture(scope="module")
def model_dir():
    try:
        return checkpoints.installed_path(SMOLLM2_135M_INSTRUCT, checkpoints.models_root(Settings().models.dir))
    except checkpoints.CheckpointError as exc:
        pytest.fail(f"{exc} (make setup installs it)")


@pytest.fixture(scope="module")
def poem_estimate(model_dir) -> int:
    """The pods' estimate of the poem request: the model's own count of its chat prompt + max_tokens."""
    counted = TokenizerCounter.from_path(model_dir).chat([wire.ChatMessage(role="user", content=POEM)])
    return counted + POEM_MAX_TOKENS


@pytest.fixture(scope="module")
def stack(infra, poem_estimate, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"  # beside the dev key: a tenant whose bucket is one poem
    quota = f"{{tenant: {QUOTA_TENANT}, key: k-{QUOTA_TENANT}, tokens_per_min: {poem_estimate}}}"
    keys.write_text(f"keys:\n  - {quota}\n")
    env = {"LLMQ_API_KEYS_FILE": str(keys)}
    with private_stack(
        infra, api_ports=API_PORTS, tiny_workers=0, sim_workers=0, smollm2_workers=1, timeout_s=240, extra_env=env
    ) as running:
        yield running


@pytest.fixture(scope="module")
def clients(stack):
    """An openai client per API pod."""
    return [
        openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="llmq-dev-key",
            default_headers={HTTP_TIMEOUT_MS: str(TIMEOUT_MS)},
            timeout=TIMEOUT_MS / 1000,
            max_retries=0,
        )
        for port in stack.cfg.api_ports
    ]


def _chat(client, messages=FRANCE, **params):
    return client.chat.completions.create(model=MODEL, messages=messages, **params)


def test_greedy_answer_holds_the_fact_and_the_pod_counts_the_model_tokens(clients, model_dir):
    answer = _chat(clients[0], temperature=0, max_tokens=16)
    choice = answer.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"  # its end-of-turn token, well before max_tokens
    messages = [wire.ChatMessage(role=m["role"], content=m["content"]) for m in FRANCE]
    assert answer.usage.prompt_tokens == TokenizerCounter.from_path(model_dir).chat(messages)


def test_a_stop_string_ends_the_answer_before_it(clients):
    answer = _chat(clients[1], temperature=0, max_tokens=16, stop=["Paris"])
    assert answer.choices[0].message.content.rstrip() == "The capital of France is"
    assert answer.choices[0].finish_reason == "stop"


def test_stream_text_equals_the_plain_text_at_temperature_0(clients):
    plain = _chat(clients[0], temperature=0, max_tokens=12).choices[0].message.content
    stream = _chat(clients[1], temperature=0, max_tokens=12, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == plain


def _streamed_logprobs(stream) -> tuple[str, list]:
    """The text and the logprob entries (chat's content entries, or the legacy lists per key) a stream carried."""
    text, entries = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += getattr(choice, "text", None) or (choice.delta.content if hasattr(choice, "delta") else "") or ""
            if choice.logprobs is not None:
                entries.append(choice.logprobs)
    return text, entries


def _same_logprobs(streamed: list[float], plain: list[float]) -> None:
    # Each request runs alone at temperature 0 (the same tokens); the second may reuse the first's cached prefix, so
    # the floats may differ in their last bits.
    assert streamed == pytest.approx(plain, abs=1e-3)


def test_chat_logprobs_are_the_same_streamed_and_not_at_temperature_0(clients):
    params = dict(temperature=0, max_tokens=12, logprobs=True, top_logprobs=5)
    plain = _chat(clients[0], **params).choices[0]
    text, chunks = _streamed_logprobs(_chat(clients[1], stream=True, **params))
    streamed = [e for chunk in chunks for e in chunk.content or []]
    entries = plain.logprobs.content
    assert text == plain.message.content and len(entries) == len(streamed) > 0
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in entries]
    assert b"".join(bytes(e.bytes) for e in entries).decode() == plain.message.content
    _same_logprobs([e.logprob for e in streamed], [e.logprob for e in entries])
    for e in entries:
        assert [t.token for t in e.top_logprobs][0] == e.token and len(e.top_logprobs) == 5


def test_a_stop_string_keeps_the_logprobs_of_the_tokens_its_text_starts_in(clients):
    answer = _chat(clients[1], temperature=0, max_tokens=16, stop=["Paris"], logprobs=True).choices[0]
    entries = answer.logprobs.content
    joined = b"".join(bytes(e.bytes) for e in entries).decode()
    # " Paris" keeps its space in the text: it stays, the last entry; nothing after it
    assert entries[-1].token == " Paris" and joined == answer.message.content + "Paris"


def test_completion_logprobs_are_the_same_streamed_and_not_at_temperature_0(clients):
    params = dict(model=MODEL, prompt="def add(a, b):\n    return", max_tokens=8, temperature=0, logprobs=3)
    plain = clients[0].completions.create(**params).choices[0]
    text, chunks = _streamed_logprobs(clients[1].completions.create(stream=True, **params))
    streamed = {key: [v for chunk in chunks for v in getattr(chunk, key)] for key in ("tokens", "text_offset")}
    assert text == plain.text and streamed == {
        "tokens": plain.logprobs.tokens,
        "text_offset": plain.logprobs.text_offset,
    }
    _same_logprobs([v for chunk in chunks for v in chunk.token_logprobs], plain.logprobs.token_logprobs)
    assert all(len(top) in (3, 4) for top in plain.logprobs.top_logprobs)  # the chosen token, when not among the 3


def test_a_seeded_sample_repeats(clients):
    texts = {_chat(clients[i], temperature=1.0, seed=1234, max_tokens=8).choices[0].message.content for i in range(2)}
    assert len(texts) == 1


def test_n_2_at_temperature_1_gives_two_choices(clients):
    answer = _chat(clients[0], temperature=1.0, n=2, max_tokens=8, seed=7)  # seeded: an EOS first draw would be ""
    assert sorted(c.index for c in answer.choices) == [0, 1]
    assert all(c.message.content for c in answer.choices)
    assert answer.usage.completion_tokens > 0


def test_a_code_completion_prompt_is_continued(clients):
    answer = clients[1].completions.create(
        model=MODEL, prompt="def reverse(s):\n    return", temperature=0, max_tokens=8
    )
    assert answer.choices[0].text.strip()


def test_a_prompt_over_the_context_window_is_a_400_with_the_models_own_count(clients, model_dir):
    content = "Paris is lovely. " * 2100  # about 8,400 tokens of this model (35,700 bytes)
    counted = TokenizerCounter.from_path(model_dir).chat([wire.ChatMessage(role="user", content=content)])
    assert counted > SMOLLM2_135M_INSTRUCT.context_window
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(clients[0], messages=[{"role": "user", "content": content}], max_tokens=8)
    assert time.monotonic() - started < 5  # refused by the pod, not after a trip to a worker
    error = raised.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"{counted + 8} tokens" in error["message"], error["message"]


async def test_a_cancel_mid_generation_frees_the_slot(stack):
    """A stream closed after its first chunk is aborted in the worker: its heartbeat shows no running sequence long
    before 2,000 tokens could have been made (its end-of-turn token is banned, so it cannot end sooner), and the next
    request is served."""
    redis = Redis.from_url(stack.cfg.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(constants.REDIS_HEARTBEATS_CHANNEL)
    port = stack.cfg.api_ports[0]
    headers = {"authorization": "Bearer llmq-dev-key", HTTP_TIMEOUT_MS: str(TIMEOUT_MS)}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from 1 to 5000, one number per line."}],
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
        "logit_bias": {"2": -100},  # <|im_end|>: no natural end
    }
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                # Held until the block ends: an iterator dropped after `break` closes the connection whenever Python
                # collects it (sometimes at once), which the pod rightly takes for a client gone and cancels.
                lines = response.aiter_lines()
                async for line in lines:
                    if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break  # the first text: generation runs
                await _running_after(pubsub, lambda n: n == 1, within_s=60)  # heartbeats from before it are read past
            # leaving the block closed the connection: the pod cancels, the worker aborts the sequence
            await _running_after(pubsub, lambda n: n == 0, within_s=60)
            reply = await client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": FRANCE, "max_tokens": 4, "temperature": 0}
            )
            assert reply.status_code == 200, reply.text
    finally:
        await pubsub.aclose()
        await redis.aclose()


async def _running_after(pubsub, wanted, within_s: float = 30) -> int:
    """The ``running`` of the model's next worker heartbeat that satisfies ``wanted``, polled until ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        if message is None:
            continue
        try:
            beat = wire.decode(message["data"])
        except msgspec.DecodeError:
            continue
        if isinstance(beat, wire.WorkerHeartbeat) and beat.model == MODEL and wanted(beat.running):
            return beat.running
    raise AssertionError(f"no heartbeat of {MODEL} with the wanted running count within {within_s} s")


def test_models_lists_the_real_context_window(clients):
    listed = {m.id: m for m in clients[0].models.list().data}
    assert listed[MODEL].model_extra["context_window"] == 8192


async def _stream_chat(client: httpx.AsyncClient, body: dict, on_text=None, **request) -> tuple[str, dict]:
    """Stream a chat completion to its end: its text and its usage (``on_text(text so far)`` after each chunk;
    ``request``: more of httpx's arguments, e.g. ``headers``)."""
    text, usage = "", None
    async with client.stream("POST", "/v1/chat/completions", json=body, **request) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            usage = event.get("usage") or usage
            text += "".join(choice["delta"].get("content") or "" for choice in event["choices"])
            if on_text is not None:
                await on_text(text)
    return text, usage


def first_found_at_or_after(text: str, chars: int, length: int = 6) -> str:
    """A piece of ``text`` of ``length`` characters whose first occurrence starts at ``chars`` or later."""
    for start in range(chars, len(text) - length + 1):
        if text.find(text[start : start + length]) == start:
            return text[start : start + length]
    raise AssertionError(f"nothing of {text!r} past {chars} characters is new")


async def test_a_stream_whose_real_model_worker_is_killed_continues_on_its_restart_with_the_same_text(
    stack, poem_estimate
):
    """kill -9 of the transformers worker mid-stream: restarted, it prefills the prompt and the tokens already sent and
    generates only the rest (docs/workers.md#continuation). At temperature 0, alone on the worker both times, the text
    is the uninterrupted run's up to a stop string found well after the kill, usage counts each token once, and the
    tenant's token bucket, charged the estimate (prompt + max_tokens) at admission, gets back exactly what the usage
    left unused: a token counted twice or not at all shows in it."""
    faults = FaultStack(stack.cfg)
    headers = {"authorization": "Bearer llmq-dev-key", HTTP_TIMEOUT_MS: str(TIMEOUT_MS)}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": POEM}],
        "max_tokens": POEM_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    killed, admitted = [], []

    async def kill_once_begun(text: str) -> None:
        if not admitted:  # taken before the request was queued; settled only once it ends
            admitted.append(await TokenBucket.read(faults, QUOTA_TENANT, poem_estimate))
        if not killed and len(text) >= KILL_AFTER_CHARS:
            killed.append(faults.send(f"worker-{MODEL}-0", signal.SIGKILL))
            await faults.heal()  # the same worker comes back and reads its uncommitted batch again

    port = stack.cfg.api_ports[0]
    quota = {"authorization": f"Bearer k-{QUOTA_TENANT}", HTTP_TIMEOUT_MS: str(TIMEOUT_MS)}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=TIMEOUT_MS) as client:
        whole, whole_usage = await _stream_chat(client, body)
        assert whole_usage["completion_tokens"] == POEM_MAX_TOKENS
        body["stop"] = first_found_at_or_after(whole, KILL_AFTER_CHARS + 48)
        reference, reference_usage = await _stream_chat(client, body)
        text, usage = await _stream_chat(client, body, kill_once_begun, headers=quota)
        bucket = await admitted[0].settled(faults)
    assert killed, f"the stream ended before {KILL_AFTER_CHARS} characters: {text!r}"
    assert reference == whole[: whole.index(body["stop"])]  # it stopped well after the kill point
    assert reference_usage["completion_tokens"] < POEM_MAX_TOKENS
    assert text == reference and usage == reference_usage
    assert admitted[0].empty  # a bucket of one estimate, all taken at admission
    assert bucket.below_cap, "the bucket refilled to its cap: the refund cannot be told apart"
    assert admitted[0].tokens_given_back(bucket) == poem_estimate - usage["total_tokens"]  # settled on each token once

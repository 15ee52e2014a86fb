"""One generation per stream, on a real stack: a worker killed with SIGKILL mid-stream and started again continues the
stream from the tokens its previous process generated (docs/workers.md#continuation): the client sees one
uninterrupted generation and its tenant's token bucket is charged each token once; an API pod killed mid-stream leaves
a stream sent with an Idempotency-Key running, and its client resumes it at the other pod after its Last-Event-ID
(docs/api.md#resuming-a-stream).

Two API pods, the batcher, the result-router and one llmq-sim worker whose fixed 6 s batches stream their tokens over
the whole batch time, so "mid-stream" is deterministic. llmq-sim replays the prompt's bytes, so every generation of a
request is known in advance. With the suite's own Kafka/Redis the stack reuses them; otherwise it brings its own.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests import ports
from tests.stacks import standalone_stack
from tests.system.faults.stack import FaultStack
from tests.system.token_bucket import TokenBucket

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BATCH_TIME_MS = 6000
API_PORT = ports.block()  # an allocated block: the restarted worker gets its metrics port (+12) back
DEV = {"authorization": "Bearer llmq-dev-key", "x-llmq-timeout-ms": "60000"}
PROMPT = "one generation per stream, continued across a killed worker or pod. "
MAX_TOKENS = 64
GENERATION = (PROMPT * 3)[:MAX_TOKENS]  # llmq-sim's completion: the prompt's bytes, cycled (a token a byte)
# The killed stream stops at STOP, well after the kill: its tenant's bucket is charged the estimate (prompt + max_tokens)
# at admission and gets back what the stop left unused, so a token counted twice or not at all shows in the bucket.
STOP = " killed"
STOPPED = GENERATION[: GENERATION.index(STOP)]
STOPPED_TOKENS = len(STOPPED) + len(STOP)  # the stop string's tokens were generated: usage counts them, as OpenAI's
ESTIMATE = len(PROMPT) + MAX_TOKENS
QUOTA_TENANT = f"quota-{uuid.uuid4().hex[:8]}"  # the suite's Redis outlives this module: a bucket of its own
QUOTA = {"authorization": f"Bearer k-{QUOTA_TENANT}", "x-llmq-timeout-ms": "60000"}
KILL_AFTER_CHARS = 12
STREAM = {
    "model": "llmq-sim",
    "prompt": PROMPT,
    "max_tokens": MAX_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}
# A killed pod is gone to the batcher (its key expired, then the grace of two intervals) within about 3.5 s, well before
# the stream ends: only the resume window keeps a resumable stream of it running. The defaults' ratios, halved.
POD_HEARTBEATS = {"LLMQ_API_POD_HEARTBEAT_INTERVAL_MS": "500", "LLMQ_API_POD_HEARTBEAT_TTL_MS": "2000"}
# The plain request and the stream sent just after it share one batch (the killed one): the batch window, 20 ms by
# default, holds well over the time between their admissions (the stream's takes from its tenant's bucket first).
ONE_BATCH = {"LLMQ_BATCHER_FIXED_ENGINE_MAX_WAIT_MS": "1500"}


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"  # the bucket holds one estimate: no cap hides a refund
    keys.write_text(f"keys:\n  - {{tenant: {QUOTA_TENANT}, key: k-{QUOTA_TENANT}, tokens_per_min: {ESTIMATE}}}\n")
    shape = dict(
        api_ports=(API_PORT, API_PORT + 1),
        tiny_workers=0,
        sim_workers=1,
        sim_batch_time_ms=BATCH_TIME_MS,
        sim_max_batch_size=8,
        extra_env=POD_HEARTBEATS | ONE_BATCH | {"LLMQ_API_KEYS_FILE": str(keys)},
    )
    own = dict(
        state_dir=ROOT / "var" / f"test-stream-{uuid.uuid4().hex[:6]}",
        kafka_port=API_PORT + 30,
        redis_port=API_PORT + 35,
    )
    with standalone_stack(infra, own, "stream-interrupted", **shape) as running:
        yield FaultStack(running.cfg)


async def stream_until_killed(
    client: httpx.AsyncClient, stack: FaultStack
) -> tuple[str, str, dict, float, TokenBucket]:
    """Stream a completion that stops at STOP as the quota tenant, SIGKILL the worker once KILL_AFTER_CHARS arrived,
    start it again; returns the request id, the text the client got, the stream's last JSON event (its usage), when
    the kill was sent (monotonic) and the tenant's token bucket as admission left it."""
    text, events, killed = "", [], 0.0
    body = STREAM | {"stop": STOP}
    async with client.stream("POST", "/v1/completions", json=body, headers=QUOTA) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        # taken before the request was queued; settled only once it ends
        admitted = await TokenBucket.read(stack, QUOTA_TENANT, ESTIMATE)
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if events[-1] == "[DONE]":
                break
            event = json.loads(events[-1])
            text += "".join(choice["text"] for choice in event.get("choices", ()))
            if not killed and len(text) >= KILL_AFTER_CHARS:
                killed = stack.send("worker-sim-0", signal.SIGKILL)
                await stack.heal()  # the same worker comes back and reads its uncommitted batches again
    assert killed, f"the stream ended before {KILL_AFTER_CHARS} characters: {text!r}"
    assert events[-1] == "[DONE]", events[-3:]
    return request_id, text, json.loads(events[-2]), killed, admitted


async def stored(client: httpx.AsyncClient, request_id: str, headers: dict | None = None) -> dict:
    """GET /v1/requests/{id} (as its tenant: ``headers``, else the client's) once the result-router has stored the
    outcome (polled with a deadline)."""
    async with asyncio.timeout(20):
        while (response := await client.get(f"/v1/requests/{request_id}", headers=headers)).status_code == 404:
            await asyncio.sleep(0.1)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_stream_whose_worker_dies_continues_on_its_restart_and_a_plain_request_runs_again(stack):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{API_PORT}", headers=DEV, timeout=60) as client:
        body = {"model": "llmq-sim", "prompt": PROMPT, "max_tokens": MAX_TOKENS}
        plain = asyncio.create_task(client.post("/v1/completions", json=body))
        plain_done: list[float] = []
        plain.add_done_callback(lambda _: plain_done.append(time.monotonic()))
        stream_id, text, last, killed_s, admitted = await stream_until_killed(client, stack)
        assert text == STOPPED  # no text repeated or missing across the seam, the stop found across it
        usage = last["usage"]
        assert "error" not in last and usage["completion_tokens"] == STOPPED_TOKENS  # each token counted once
        assert admitted.empty  # a fresh bucket of ESTIMATE tokens, all taken at admission
        bucket = await admitted.settled(stack)
        assert bucket.below_cap, "the bucket refilled to its cap: the refund cannot be told apart"
        assert admitted.tokens_given_back(bucket) == ESTIMATE - usage["total_tokens"]  # settled on each token once

        outcome = await stored(client, stream_id, QUOTA)
        assert outcome["status"] == "succeeded", outcome
        assert (outcome["response"]["choices"][0]["text"], outcome["usage"]["completion_tokens"]) == (
            STOPPED,
            STOPPED_TOKENS,
        )

        response = await plain
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == GENERATION
        assert plain_done[0] - killed_s >= BATCH_TIME_MS / 1000  # a whole batch after the kill: it ran again
        assert (await stored(client, response.headers["x-request-id"]))["status"] == "succeeded"


async def read_events(response: httpx.Response, until_chars: int | None = None) -> tuple[str, int | None, list[str]]:
    """Read a stream's events as an SSE client does (an event counts once its blank line arrived): the text of its
    choices, the id of its last event that carried one, and every event's data; stops at ``[DONE]``, or once
    ``until_chars`` of text arrived."""
    text, last_id, datas, event = "", None, [], {}
    async for line in response.aiter_lines():
        if line:
            field, _, value = line.partition(": ")
            event[field] = value
            continue
        if "id" in event:
            last_id = int(event["id"])
        if "data" in event:
            datas.append(event["data"])
            if event["data"] == "[DONE]":
                break
            text += "".join(choice["text"] for choice in json.loads(event["data"]).get("choices", ()))
        event = {}
        if until_chars is not None and len(text) >= until_chars:
            break
    return text, last_id, datas


async def test_a_keyed_stream_whose_api_pod_is_killed_resumes_at_the_other_pod_after_its_last_event_id(stack):
    headers = {"idempotency-key": f"resume-{uuid.uuid4().hex}"}
    first_pod, other_pod = (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=DEV, timeout=60) for port in stack.api_ports
    )
    async with first_pod, other_pod:
        async with first_pod.stream("POST", "/v1/completions", json=STREAM, headers=headers) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            before, last_id, _ = await read_events(response, until_chars=KILL_AFTER_CHARS)
            stack.send("api-0", signal.SIGKILL)
        assert last_id == len(before) > 0  # an event's id: the characters of text the stream held
        resume = headers | {"last-event-id": str(last_id)}
        async with other_pod.stream("POST", "/v1/completions", json=STREAM, headers=resume) as response:
            assert response.status_code == 200 and response.headers["x-request-id"] == request_id
            after, final_id, events = await read_events(response)
        assert events[-1] == "[DONE]" and final_id == len(GENERATION)
        assert len(events) > len(after) // 2  # streamed from the log as generated, not all at once with the result
        assert before + after == GENERATION  # no text repeated or missing across the pods
        assert json.loads(events[-2])["usage"]["completion_tokens"] == MAX_TOKENS

        outcome = await stored(other_pod, request_id)
    assert outcome["status"] == "succeeded" and outcome["response"]["choices"][0]["text"] == GENERATION
    await stack.heal()

"""Batch jobs through a real stack (API pods, batcher, llmq-sim workers, result-router as processes) with the official
``openai`` SDK; kcat for the Kafka-direct format.

The stack runs on the suite's Kafka and Redis (tests/conftest.py), or, when the environment names other ones, on a
private Kafka and Redis of its own (allocated ports) so that killing its result-router disturbs nobody.
Retries, cancels and the window's end are driven by a fake worker in this test that serves a model of its own on an
otherwise unused partition of llmq.batches: its prompts say how it answers (fail once, fail always, hold).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.asyncio import Redis

from llmq_cli.batch import sample_lines
from llmq_cli.devstack import StackConfig
from llmq_core import constants, kafka, wire
from tests import ports
from tests.builders import heartbeat
from tests.fake_results import fake_result
from tests.stacks import kcat_request, standalone_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHARED_CLAIMS = ROOT.parent / "shared" / "data" / "claims-batch.jsonl"
BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
PRIVATE = dict(state_dir=ROOT / "var" / "batch-test", kafka_port=BASE + 30, redis_port=BASE + 35)
FAKE_MODEL = f"batch-fake-{uuid.uuid4().hex[:6]}"
FAKE_PARTITION = 15  # the stack's workers take partitions 0 and 1
ENDED = ("completed", "failed", "expired", "cancelled")
STACK_ENV = {
    "LLMQ_BATCH_LEASE_MS": "3000",
    "LLMQ_BATCH_RETRY_BACKOFF_MS": "200",
    "LLMQ_BATCH_END_GRACE_MS": "3000",
    "LLMQ_BATCH_MAX_ROUNDS": "2",
}


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    env = {**STACK_ENV, "LLMQ_FILES_URL": str(tmp_path_factory.mktemp("batch-files"))}
    shape = dict(api_ports=API_PORTS, tiny_workers=0, sim_workers=2, sim_batch_time_ms=300, extra_env=env)
    with standalone_stack(infra, PRIVATE, **shape) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{stack.cfg.api_ports[0]}/v1", api_key="llmq-dev-key", max_retries=0, timeout=120
    )


def sim_answer(text: str, max_tokens: int) -> str:
    """llmq-sim: the last user message's bytes from its start, cycled, ``max_tokens`` of them."""
    data = text.encode()
    return bytes(data[i % len(data)] for i in range(max_tokens)).decode("utf-8", errors="ignore")


def chat_line(custom_id: str, content: str, model: str = "llmq-sim", max_tokens: int = 8) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]},
    }


async def upload(client: openai.AsyncOpenAI, lines: list[dict] | bytes) -> str:
    data = lines if isinstance(lines, bytes) else "".join(json.dumps(x) + "\n" for x in lines).encode()
    return (await client.files.create(file=("input.jsonl", data), purpose="batch")).id


async def submit(client: openai.AsyncOpenAI, lines, window: str = "24h"):
    return await client.batches.create(
        input_file_id=await upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window=window,
        metadata={"test": "batch-jobs"},
    )


async def wait_until(client: openai.AsyncOpenAI, batch, done, timeout_s: float = 120.0):
    """Poll the batch until ``done(batch)``; returns it."""
    deadline = time.monotonic() + timeout_s
    while not done(batch):
        assert time.monotonic() < deadline, f"batch stuck: {batch.status} {batch.request_counts}"
        await asyncio.sleep(0.3)
        batch = await client.batches.retrieve(batch.id)
    return batch


async def finish(client: openai.AsyncOpenAI, batch, timeout_s: float = 120.0):
    """Wait for the batch to end; returns (batch, output lines, error lines)."""
    batch = await wait_until(client, batch, lambda b: b.status in ENDED, timeout_s)
    return batch, await file_lines(client, batch.output_file_id), await file_lines(client, batch.error_file_id)


async def file_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in (await client.files.content(file_id)).text.splitlines()]


def assert_each_line_once(lines: list[dict], output: list[dict], errors: list[dict]) -> None:
    ids = [x["custom_id"] for x in output + errors]
    assert sorted(ids) == sorted(x["custom_id"] for x in lines), "a custom_id is missing or repeated"


def usage_of(output: list[dict]) -> int:
    return sum(x["response"]["body"]["usage"]["total_tokens"] for x in output)


# --- the normal path -------------------------------------------------------------------------------------------------


async def test_a_300_line_sample_completes_with_the_openai_sdk(client):
    lines = sample_lines(300, "llmq-sim", seed=11)
    started = time.perf_counter()
    batch = await submit(client, lines, window="10m")
    assert batch.status == "in_progress" and batch.request_counts.total == 300
    partial = await file_lines(client, batch.output_file_id)  # whatever finished so far
    batch, output, errors = await finish(client, batch)
    elapsed_s = time.perf_counter() - started
    assert batch.status == "completed" and errors == []
    assert_each_line_once(lines, output, errors)
    assert {x["custom_id"] for x in partial} <= {x["custom_id"] for x in output}
    by_id = {x["custom_id"]: x for x in lines}
    for line in output:
        body = by_id[line["custom_id"]]["body"]
        answer = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["content"] == sim_answer(
            body["messages"][-1]["content"], body["max_tokens"]
        )
    assert batch.request_counts.completed == 300 and batch.request_counts.failed == 0
    assert batch.usage.total_tokens == usage_of(output)
    assert batch.metadata == {"test": "batch-jobs"} and batch.completed_at >= batch.in_progress_at
    print(f"300-line sample: {elapsed_s:.1f}s")


@pytest.mark.skipif(not SHARED_CLAIMS.exists(), reason="the shared claims file is not here")
async def test_the_shared_claims_file_completes_on_llmq_sim(client):
    # Its model is llmq-tiny; rewritten to llmq-sim so the test stays fast (the stack runs no llmq-tiny worker).
    lines = [json.loads(x) for x in SHARED_CLAIMS.read_text().splitlines() if x.strip()]
    for line in lines:
        line["body"]["model"] = "llmq-sim"
    batch, output, errors = await finish(client, await submit(client, lines))
    assert batch.status == "completed" and len(output) == len(lines) == 300 and errors == []
    assert_each_line_once(lines, output, errors)


async def test_structural_faults_fail_the_batch_and_a_bad_body_errs_alone(client):
    broken = await submit(
        client, b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\nnot json\n'
    )
    assert broken.status == "failed" and broken.failed_at is not None
    assert [(e.code, e.line) for e in broken.errors.data] == [("invalid_json_line", 2)]
    lines = [chat_line("good", "hello"), chat_line("unknown-model", "hello", model="no-such-model")]
    batch, output, errors = await finish(client, await submit(client, lines))
    assert batch.status == "completed" and [x["custom_id"] for x in output] == ["good"]
    assert [(x["custom_id"], x["response"]["status_code"]) for x in errors] == [("unknown-model", 404)]


REFUSED_BODIES = {  # custom_id -> a chat body the endpoint refuses: each kind of validation fault
    "range": {"temperature": 9},
    "n": {"n": 129},
    "bigint": {"max_tokens": 10**30},
    "type": {"max_tokens": "four"},
    "model": {"model": "no-such-model"},
    "missing": {"messages": None},
    "too-long": {"max_tokens": 8192},
    "stops": {"stop": ["s"] * 5},
    "bias": {"logit_bias": {"1" * 5000: 1}},
    "role": {"messages": [{"role": "wizard", "content": "hi"}]},
    "top-logprobs": {"logprobs": True, "top_logprobs": 21},
}


async def test_a_refused_line_carries_the_endpoints_own_status_and_error_object(client, stack):
    base = chat_line("x", "hello")["body"]
    bodies = {
        cid: {k: v for k, v in {**base, **change}.items() if v is not None} for cid, change in REFUSED_BODIES.items()
    }
    batch, output, errors = await finish(
        client, await submit(client, [{**chat_line(cid, "hello"), "body": body} for cid, body in bodies.items()])
    )
    assert batch.status == "completed" and output == [] and len(errors) == len(bodies)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.cfg.api_ports[0]}", headers={"Authorization": "Bearer llmq-dev-key"}
    ) as http:
        for line in errors:
            answer = await http.post("/v1/chat/completions", json=bodies[line["custom_id"]])
            assert (line["response"]["status_code"], line["response"]["body"]) == (answer.status_code, answer.json())
            assert answer.json()["error"]["param"] is not None, line


async def test_a_line_asking_for_logprobs_gets_them_as_the_endpoint_answers(client, stack):
    body = {**chat_line("lp", "héllo")["body"], "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
    batch, output, errors = await finish(client, await submit(client, [{**chat_line("lp", "héllo"), "body": body}]))
    assert batch.status == "completed" and errors == []
    (line,) = output
    answer = line["response"]["body"]["choices"][0]
    assert answer["message"]["content"] == "hél"
    assert [e["token"] for e in answer["logprobs"]["content"]] == ["h", "\\xc3", "\\xa9", "l"]
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.cfg.api_ports[0]}", headers={"Authorization": "Bearer llmq-dev-key"}
    ) as http:
        plain = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert answer["logprobs"] == plain["logprobs"]  # llmq-sim's are deterministic


async def test_an_idempotency_key_repeats_only_the_same_create(client):
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    files = [await upload(client, [chat_line(cid, "hi")]) for cid in ("a", "b")]
    first = await client.batches.create(
        input_file_id=files[0], endpoint="/v1/chat/completions", completion_window="24h", extra_headers=key
    )
    again = await client.batches.create(
        input_file_id=files[0], endpoint="/v1/chat/completions", completion_window="24h", extra_headers=key
    )
    assert again.id == first.id
    for other in (
        {"input_file_id": files[1]},
        {"input_file_id": files[0], "metadata": {"x": "y"}},
        {"input_file_id": files[0], "completion_window": "48h"},
    ):
        with pytest.raises(openai.UnprocessableEntityError) as reused:
            await client.batches.create(
                **{"endpoint": "/v1/chat/completions", "completion_window": "24h", **other}, extra_headers=key
            )
        assert reused.value.code == "idempotency_key_reused"
    await finish(client, first)


async def test_files_and_batches_are_invisible_to_another_tenant(client, stack):
    batch = await submit(client, [chat_line("a", "hi")])
    other = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{stack.cfg.api_ports[1]}/v1", api_key="llmq-dev-free-key", max_retries=0
    )
    for call in (
        lambda: other.files.retrieve(batch.input_file_id),
        lambda: other.files.content(batch.input_file_id),
        lambda: other.files.delete(batch.input_file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            await call()
    assert batch.id not in [b.id async for b in other.batches.list()]
    assert batch.id in [b.id async for b in client.batches.list(limit=5)]
    await finish(client, batch)


# --- retries, cancels, deadlines (a fake worker decides how each line fares) -----------------------------------------


class FakeWorker:
    """A worker for FAKE_MODEL on FAKE_PARTITION: heartbeats, reads its partition, answers on llmq.results.

    A prompt starting with ``flaky`` fails (retryable) on its first attempt, ``doomed`` always fails (retryable),
    ``hold`` waits for a Cancel or its deadline; anything else succeeds with the prompt as text.
    """

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.held: dict[str, wire.GenerationRequest] = {}
        self.attempts: dict[str, list[int]] = {}
        self.last_batch_id = ""
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.redis = Redis.from_url(self.cfg.redis_url)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.cfg.kafka_bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cfg.kafka_bootstrap, group_id=None, enable_auto_commit=False
        )
        await self.producer.start()
        await self.consumer.start()
        partition = TopicPartition(constants.TOPIC_BATCHES, FAKE_PARTITION)
        self.consumer.assign([partition])
        await self.consumer.seek_to_end(partition)
        await self.consumer.position(partition)
        self.pubsub = self.redis.pubsub()
        await self.pubsub.subscribe(constants.REDIS_CANCELS_CHANNEL)
        self._tasks = [asyncio.create_task(loop()) for loop in (self._beat, self._consume, self._cancels)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pubsub.aclose()
        await self.consumer.stop()
        await self.producer.stop()
        await self.redis.aclose()

    async def _beat(self) -> None:
        while True:
            beat = heartbeat(
                FAKE_MODEL,
                worker_id=f"fake-{FAKE_MODEL}",
                partition=FAKE_PARTITION,
                max_slots=64,
                running=len(self.held),
                sent_ms=int(time.time() * 1000),
                context_window=8192,
                last_batch_id=self.last_batch_id,
            )
            await self.redis.publish(constants.REDIS_HEARTBEATS_CHANNEL, wire.encode(beat))
            await asyncio.sleep(0.25)

    async def _consume(self) -> None:
        while True:
            for records in (await self.consumer.getmany(timeout_ms=100)).values():
                for record in records:
                    batch = wire.decode(record.value)
                    self.last_batch_id = batch.batch_id
                    for request in batch.requests:
                        await self._take(request)

    async def _take(self, request: wire.GenerationRequest) -> None:
        prompt = request.messages[-1].content
        self.attempts.setdefault(request.reply_to.custom_id, []).append(request.attempt)
        failing = prompt.startswith("doomed") or (prompt.startswith("flaky") and request.attempt == 0)
        if failing:
            error = wire.ErrorInfo(type="engine_error", message="injected transient failure", retryable=True)
            await self._answer(request, wire.Outcome.ERRORED, error=error)
        elif prompt.startswith("hold"):
            self.held[request.request_id] = request
            asyncio.get_running_loop().call_later(
                max(0.0, request.deadline_ms / 1000 - time.time()),
                lambda: asyncio.ensure_future(self._expire(request.request_id)),
            )
        else:
            await self._answer(request, wire.Outcome.SUCCEEDED, text=prompt[: request.sampling.max_tokens])

    async def _expire(self, request_id: str) -> None:
        request = self.held.pop(request_id, None)
        if request is not None:
            await self._answer(request, wire.Outcome.EXPIRED)

    async def _cancels(self) -> None:
        while True:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is None:
                continue
            request = self.held.pop(wire.decode(message["data"]).request_id, None)
            if request is not None:  # stopped mid-generation: some tokens were computed, none are billed
                await self._answer(request, wire.Outcome.CANCELED, text="partial")

    async def _answer(
        self,
        request: wire.GenerationRequest,
        outcome: wire.Outcome,
        text: str = "",
        error: wire.ErrorInfo | None = None,
    ) -> None:
        result = fake_result(request, outcome, text, error=error, worker_id="fake", finished_ms=int(time.time() * 1000))
        await kafka.send_message(self.producer, constants.TOPIC_RESULTS, result, key=request.request_id)


@pytest.fixture(scope="module")
async def fake_worker(stack, client):
    worker = FakeWorker(stack.cfg)
    await worker.start()
    deadline = time.monotonic() + 30
    while FAKE_MODEL not in [m.id async for m in client.models.list()]:  # the API pods learn it from heartbeats
        assert time.monotonic() < deadline, "the API pods never saw the fake worker's model"
        await asyncio.sleep(0.3)
    yield worker
    await worker.stop()


async def test_transient_server_errors_are_retried_to_success_and_the_hopeless_become_dead_letters(client, fake_worker):
    lines = [chat_line(f"flaky-{i}", f"flaky {i}", FAKE_MODEL) for i in range(20)]
    lines += [chat_line("ok", "fine", FAKE_MODEL), chat_line("doomed", "doomed", FAKE_MODEL)]
    batch, output, errors = await finish(client, await submit(client, lines))
    assert batch.status == "completed"
    assert_each_line_once(lines, output, errors)
    assert sorted(x["custom_id"] for x in output) == sorted([f"flaky-{i}" for i in range(20)] + ["ok"])
    assert [(x["custom_id"], x["response"]["status_code"], x["dead_letter"]) for x in errors] == [("doomed", 503, True)]
    assert fake_worker.attempts["flaky-3"] == [0, 1] and fake_worker.attempts["ok"] == [0]
    assert fake_worker.attempts["doomed"] == [0, 1, 2]  # LLMQ_BATCH_MAX_ROUNDS=2 retries
    llmq = batch.model_extra["llmq"]
    assert (llmq["retried"], llmq["dead_letters"]) == (22, 1)


async def test_a_cancel_mid_run_leaves_the_rest_cancelled_and_unbilled(client, fake_worker):
    lines = [chat_line(f"quick-{i}", f"quick {i}", FAKE_MODEL) for i in range(10)]
    lines += [chat_line(f"hold-{i}", f"hold {i}", FAKE_MODEL) for i in range(20)]
    batch = await submit(client, lines)
    batch = await wait_until(client, batch, lambda b: b.request_counts.completed == 10)
    await wait_until(
        client, batch, lambda b: len([r for r in fake_worker.held.values() if r.reply_to.batch_id == batch.id]) == 20
    )
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    batch, output, errors = await finish(client, cancelling)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert_each_line_once(lines, output, errors)
    assert sorted(x["custom_id"] for x in output) == sorted(f"quick-{i}" for i in range(10))
    assert {(x["error"]["code"], x["response"]) for x in errors} == {("batch_cancelled", None)}
    assert batch.request_counts.completed == 10 and batch.request_counts.failed == 20
    assert batch.usage.total_tokens == usage_of(output)  # the held lines' partial work is not billed
    still_held = [r for r in fake_worker.held.values() if r.reply_to.batch_id == batch.id]
    assert not still_held, "a running line was not cancelled"


async def test_work_not_done_in_the_window_ends_expired(client, fake_worker):
    lines = [chat_line("quick", "quick", FAKE_MODEL)] + [chat_line(f"hold-{i}", "hold", FAKE_MODEL) for i in range(3)]
    batch, output, errors = await finish(client, await submit(client, lines, window="3s"), timeout_s=30)
    assert batch.status == "expired" and batch.expired_at is not None
    assert [x["custom_id"] for x in output] == ["quick"]
    assert sorted((x["custom_id"], x["error"]["code"]) for x in errors) == [
        (f"hold-{i}", "batch_expired") for i in range(3)
    ]


# --- crashes ---------------------------------------------------------------------------------------------------------


async def test_a_result_router_killed_mid_job_loses_and_doubles_nothing(client, stack):
    lines = sample_lines(1500, "llmq-sim", seed=5)
    batch = await submit(client, lines)
    batch = await wait_until(client, batch, lambda b: b.request_counts.completed >= 150)
    pid = json.loads((stack.pids / "result-router.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    frozen = (await client.batches.retrieve(batch.id)).request_counts
    await asyncio.to_thread(stack.up, 120, lambda *_: None)  # starts what is not running: the router
    batch, output, errors = await finish(client, batch, timeout_s=180)
    assert frozen.completed < 1500, "the job ended before the kill: nothing was tested"
    assert batch.status == "completed" and errors == []
    assert_each_line_once(lines, output, errors)
    assert batch.request_counts.completed == 1500 and batch.usage.total_tokens == usage_of(output)


# --- Kafka-direct producers ------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by `make test`")
async def test_the_documented_kafka_request_is_answered_on_its_reply_topic(stack):
    doc = (ROOT / "docs" / "kafka-producers.md").read_text()
    request = json.loads(re.search(r"<!-- example:generation_request -->\n```json\n(.*?)\n```", doc, re.S).group(1))
    now_ms = int(time.time() * 1000)
    request_id = f"kcat-batch-{uuid.uuid4().hex[:10]}"
    request.update(
        request_id=request_id,
        created_ms=now_ms,
        deadline_ms=now_ms + 60_000,
        reply_to={**request["reply_to"], "topic": f"test.batch-replies.{request_id}"},
    )
    result = await kcat_request(stack, constants.requests_topic(request["traffic_class"]), request)
    assert (result["request_id"], result["outcome"]) == (request_id, "succeeded")
    user = request["messages"][-1]["content"]
    assert result["choices"][0]["text"] == sim_answer(user, request["sampling"]["max_tokens"])

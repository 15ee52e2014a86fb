"""The batcher alone, fed by a Kafka-direct producer (``llmq bench scale --feeds kafka``): open-loop Poisson
arrivals of interactive paid GenerationRequests produced straight to ``llmq.requests.interactive`` with a Kafka reply
topic of their own, no API pod and no HTTP load generator on the path, so the batcher's CPU per request is measured
without them competing for the machine (issue 28, item 7).

Pure parts (:func:`direct_request`, :func:`summarize`) are apart from the producer and the reply reader
(:func:`run_feed`), so they can be tested alone.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer

from llmq_bench.loadgen import quantiles_ms
from llmq_bench.prompts import CodePrompt
from llmq_core import constants, kafka, wire
from llmq_core.settings import Settings

TENANT = "bench-direct"  # the tenant of the direct requests (a PLAINTEXT stack takes a producer's tenant as given)
REPLY_TOPIC_PREFIX = "bench.direct."
SUCCEEDED = "succeeded"


def direct_request(
    index: int, prompt: CodePrompt, reply_topic: str, *, model: str, now_ms: int, timeout_ms: int, run_id: str
) -> wire.GenerationRequest:
    """The ``index``-th request of run ``run_id``: ``prompt`` for ``model``, interactive and paid, answered on
    ``reply_topic``, due ``timeout_ms`` after ``now_ms`` (epoch ms)."""
    return wire.GenerationRequest(
        request_id=f"direct-{run_id}-{index}",
        tenant_id=TENANT,
        model=model,
        prompt=prompt.prompt,
        sampling=wire.SamplingParams(max_tokens=prompt.max_tokens),
        created_ms=now_ms,
        deadline_ms=now_ms + timeout_ms,
        reply_to=wire.KafkaReply(topic=reply_topic),
    )


def summarize(sent_s: dict[str, float], replies: dict[str, tuple[float, str]], window_s: float) -> dict:
    """``sent_s``: request_id -> monotonic send time; ``replies``: request_id -> (monotonic reply time, outcome).
    Returns requests, answered (succeeded), other outcomes, unanswered, offered and answered req/s over ``window_s``
    (the arrivals' window) and the answered requests' latency quantiles (ms, send to reply)."""
    outcomes: dict[str, int] = {}
    latencies = []
    for request_id, (at_s, outcome) in replies.items():
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == SUCCEEDED and request_id in sent_s:
            latencies.append((at_s - sent_s[request_id]) * 1000)
    answered = outcomes.pop(SUCCEEDED, 0)
    return {
        "requests": len(sent_s),
        "answered": answered,
        "other_outcomes": outcomes,
        "unanswered": sum(request_id not in replies for request_id in sent_s),
        "offered_rps": round(len(sent_s) / window_s, 1) if window_s else 0.0,
        "throughput_rps": round(answered / window_s, 1) if window_s else 0.0,
        "latency_ms": quantiles_ms(latencies),
    }


async def run_feed(
    settings: Settings,
    arrivals: Sequence[float],
    prompts: Sequence[CodePrompt],
    *,
    model: str,
    timeout_s: float,
    window_s: float,
) -> dict:
    """Produce one request per arrival (seconds from the start; prompts in turn), each answered on a fresh reply
    topic, and read the replies until every request has one or ``timeout_s`` after the last arrival;
    :func:`summarize`'s figures over the arrivals' ``window_s``."""
    run_id = uuid.uuid4().hex[:8]
    topic = f"{REPLY_TOPIC_PREFIX}{run_id}"
    await kafka.create_topic(settings, topic)
    producer = kafka.make_producer(settings)
    reader = kafka.make_consumer(settings, topic, group_id=None)
    sent_s: dict[str, float] = {}
    replies: dict[str, tuple[float, str]] = {}
    await producer.start()
    await reader.start()
    collecting = asyncio.create_task(_collect(reader, replies))
    try:
        await _produce(producer, arrivals, prompts, topic, sent_s, model=model, timeout_s=timeout_s, run_id=run_id)
        deadline = time.monotonic() + timeout_s
        while len(replies) < len(sent_s) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        collecting.cancel()
        await asyncio.gather(collecting, return_exceptions=True)
        await producer.stop()
        await reader.stop()
    return summarize(sent_s, replies, window_s)


async def _produce(producer, arrivals, prompts, topic, sent_s, *, model, timeout_s, run_id) -> None:
    start = time.monotonic()
    pending = []
    for index, at_s in enumerate(arrivals):
        await asyncio.sleep(max(0.0, start + at_s - time.monotonic()))
        request = direct_request(
            index,
            prompts[index % len(prompts)],
            topic,
            model=model,
            now_ms=int(time.time() * 1000),
            timeout_ms=int(timeout_s * 1000),
            run_id=run_id,
        )
        sent_s[request.request_id] = time.monotonic()
        pending.append(
            await producer.send(
                constants.requests_topic(constants.INTERACTIVE),
                wire.encode(request),
                key=request.request_id.encode(),
                headers=kafka.headers(),
            )
        )
    await asyncio.gather(*pending)


async def _collect(reader: AIOKafkaConsumer, replies: dict[str, tuple[float, str]]) -> None:
    async for record in reader:
        reply = json.loads(record.value)
        replies.setdefault(reply["request_id"], (time.monotonic(), reply.get("outcome", "")))

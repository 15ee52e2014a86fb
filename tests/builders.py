"""Wire messages, job records and API request bodies as tests build them: a plain default for every field a test does
not care about."""

from __future__ import annotations

import time

from llmq_core import wire
from llmq_jobs import jobs

MODEL = "llmq-sim"


def heartbeat(model: str = MODEL, *, max_slots: int = 8, running: int = 0, queued: int = 0, **fields):
    """Worker ``w``'s heartbeat on partition 0, sent at 0, its free slots those neither running nor queued;
    ``fields``: the rest (worker_id, free_slots, sent_ms, context_window, ...)."""
    free_slots = max_slots - running - queued
    defaults = {"worker_id": "w", "partition": 0, "free_slots": free_slots, "est_drain_ms": 0, "sent_ms": 0}
    return wire.WorkerHeartbeat(
        model=model, max_slots=max_slots, running=running, queued=queued, **{**defaults, **fields}
    )


def generation_request(
    request_id: str = "r1", *, now_ms: int = 0, deadline_in_ms: int = 1, instance_id: str = "pod-1", **fields
) -> wire.GenerationRequest:
    """A request for llmq-sim, created at ``now_ms``, answered over HTTP to pod ``instance_id``; ``fields``: the rest
    (prompt, tenant_id, sampling, ...)."""
    fields = {"model": MODEL, "prompt": "x", "reply_to": wire.HttpReply(instance_id=instance_id), **fields}
    return wire.GenerationRequest(
        request_id=request_id, created_ms=now_ms, deadline_ms=now_ms + deadline_in_ms, **fields
    )


def kafka_request(request_id: str, topic: str, **fields) -> wire.GenerationRequest:
    """A request for llmq-sim as a client produces it straight to Kafka: tenant ``dev``, created now (wall clock), due
    in 60 s, 4 tokens at most, its reply on ``topic``; ``fields``: the rest (tenant_id, prompt, ...)."""
    fields = {"tenant_id": "dev", "prompt": "hello", "sampling": wire.SamplingParams(max_tokens=4), **fields}
    now_ms = int(time.time() * 1000)
    reply_to = wire.KafkaReply(topic=topic)
    return generation_request(request_id, now_ms=now_ms, deadline_in_ms=60_000, reply_to=reply_to, **fields)


def job_spec(batch_id: str = "batch_x", **fields) -> jobs.JobSpec:
    """A completions job of tenant ``t`` over file ``file-in`` with its output and error files named; ``fields``: the
    rest (created_ms, expires_ms, total, runnable, ...)."""
    defaults = {
        "tenant_id": "t",
        "endpoint": "/v1/completions",
        "input_file_id": "file-in",
        "completion_window": "24h",
        "created_ms": 1,
        "expires_ms": 2,
        "output_file_id": "file-o",
        "error_file_id": "file-e",
    }
    return jobs.JobSpec(id=batch_id, **{**defaults, **fields})


def chat_body(content: str, max_tokens: int, **fields) -> dict:
    """A chat completion request body for llmq-sim with one user message; ``fields``: the rest (stream, ...)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **fields}


# (httpx request arguments, status, error param) of bodies no endpoint can read: refused before any request exists.
UNREADABLE_BODIES = [
    (
        {"content": b'{"model": "llmq-sim", "prompt": "a"}', "headers": {"content-type": "text/plain"}},
        415,
        "content-type",
    ),
    ({"content": b"{", "headers": {"content-type": "application/json"}}, 400, None),
    ({"content": b'{"model": ', "headers": {"content-type": "application/json"}}, 400, None),
    ({"content": b"[]", "headers": {"content-type": "application/json"}}, 400, None),
    ({"json": ["not", "an", "object"]}, 400, None),
]

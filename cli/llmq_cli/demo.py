"""``llmq demo``: real code-completion prompts and chat questions through the official ``openai`` SDK against both API
pods at once, streamed (so time to first token is measured), with the engines' running batch sampled from heartbeats."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass, field

import msgspec
import openai
import redis as redis_sync
import redis.asyncio as redis_async

from llmq_bench.prompts import CodePrompt
from llmq_core import constants, wire
from llmq_core.constants import HTTP_TIMEOUT_MS

DEMO_TIMEOUT_MS = 120_000  # the demo measures queueing too: a burst of long prompts may wait behind each other


@dataclass(frozen=True)
class Ask:
    """One demo request: a code completion (``prompt``) or a chat question (``question``) to ``model``."""

    model: str
    max_tokens: int
    prompt: str | None = None
    question: str | None = None

    @property
    def text(self) -> str:
        return self.question if self.question is not None else self.prompt or ""


@dataclass
class ModelReport:
    model: str
    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    wall_s: float = 0.0
    mean_batch_size: float = 0.0  # requests per Kafka batch (the batcher's)
    running: list[int] = field(default_factory=list)  # the engine's running sequences, one per busy heartbeat
    answers: list[tuple[Ask, str]] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.latencies_s) + sum(self.errors.values())


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def code_asks(prompts: list[CodePrompt], models: list[str]) -> list[Ask]:
    """One completion per prompt, to the ``models`` in turn."""
    return [Ask(model=models[i % len(models)], prompt=p.prompt, max_tokens=p.max_tokens) for i, p in enumerate(prompts)]


def chat_asks(questions: list[str], model: str, max_tokens: int) -> list[Ask]:
    return [Ask(model=model, question=q, max_tokens=max_tokens) for q in questions]


async def _one(client: openai.AsyncOpenAI, ask: Ask, report: ModelReport, gate: asyncio.Semaphore) -> None:
    """Stream one request at temperature 0: its latency, time to first text, completion tokens and answer."""
    params = dict(
        model=ask.model,
        max_tokens=ask.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={HTTP_TIMEOUT_MS: str(DEMO_TIMEOUT_MS)},
    )
    async with gate:
        started = time.perf_counter()
        parts: list[str] = []
        try:
            if ask.question is not None:
                stream = await client.chat.completions.create(
                    messages=[{"role": "user", "content": ask.question}], **params
                )
            else:
                stream = await client.completions.create(prompt=ask.prompt, **params)
            async for chunk in stream:
                text = _chunk_text(chunk)
                if text and not parts:
                    report.ttfts_s.append(time.perf_counter() - started)
                parts.append(text)
                if chunk.usage is not None:
                    report.completion_tokens += chunk.usage.completion_tokens
        except openai.APIError as exc:
            kind = type(exc).__name__
            report.errors[kind] = report.errors.get(kind, 0) + 1
            return
        report.latencies_s.append(time.perf_counter() - started)
        report.answers.append((ask, "".join(parts)))


def _chunk_text(chunk) -> str:
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    delta = getattr(choice, "delta", None)
    return (delta.content if delta is not None else choice.text) or ""


async def run_demo(
    asks: list[Ask], base_urls: list[str], concurrency: int, redis_url: str, api_key: str = "llmq-dev-key"
) -> list[ModelReport]:
    """Send every request once, to the pods in turn, at most ``concurrency`` in flight; meanwhile sample the engines'
    running sequences from the worker heartbeats."""
    clients = [openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=120) for url in base_urls]
    reports = {ask.model: ModelReport(ask.model) for ask in asks}
    gate = asyncio.Semaphore(concurrency)
    sampler = asyncio.create_task(_sample_running(redis_url, reports))
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(_one(clients[i % len(clients)], ask, reports[ask.model], gate) for i, ask in enumerate(asks))
        )
    finally:
        sampler.cancel()
        for client in clients:
            await client.close()
    for report in reports.values():
        report.wall_s = time.perf_counter() - started
    return list(reports.values())


async def _sample_running(redis_url: str, reports: dict[str, ModelReport]) -> None:
    """Append each busy heartbeat's ``running`` to its model's report (a continuous-batching engine's batch size)."""
    redis = redis_async.Redis.from_url(redis_url)
    pubsub = redis.pubsub()
    try:
        await pubsub.subscribe(constants.REDIS_HEARTBEATS_CHANNEL)
        async for message in pubsub.listen():
            if message["type"] != "message":
                continue
            try:
                beat = wire.decode(message["data"])
            except msgspec.MsgspecError:
                continue
            report = reports.get(getattr(beat, "model", ""))
            if isinstance(beat, wire.WorkerHeartbeat) and report is not None and beat.running > 0:
                report.running.append(beat.running)
    finally:
        await pubsub.aclose()
        await redis.aclose()


def samples(answers: list[tuple[Ask, str]], count: int) -> list[tuple[Ask, str]]:
    """Up to ``count`` answers to show, chat questions first (in the order sent), then code completions."""
    chats = [a for a in answers if a[0].question is not None]
    return (chats[: count - 1] + [a for a in answers if a[0].question is None] + chats[count - 1 :])[:count]


def batcher_counts(redis_url: str, model: str) -> tuple[int, int]:
    """(batches, requests) of ``model`` the batcher has dispatched so far."""
    stats = redis_sync.Redis.from_url(redis_url).hgetall(constants.STATS_BATCHER)
    return int(stats.get(f"batches:{model}".encode(), 0)), int(stats.get(f"requests:{model}".encode(), 0))


def summary_rows(reports: list[ModelReport]) -> list[dict]:
    rows = []
    for report in reports:
        ms = [s * 1000 for s in report.latencies_s]
        rows.append(
            {
                "model": report.model,
                "requests": report.requests,
                "successes": len(ms),
                "errors": sum(report.errors.values()),
                "p50_ms": percentile(ms, 50),
                "p95_ms": percentile(ms, 95),
                "p99_ms": percentile(ms, 99),
                "mean_ms": statistics.fmean(ms) if ms else 0.0,
                "ttft_p50_ms": percentile([s * 1000 for s in report.ttfts_s], 50),
                "completion_tokens_per_s": report.completion_tokens / report.wall_s if report.wall_s else 0.0,
                "mean_batch_size": report.mean_batch_size,
                "mean_running": statistics.fmean(report.running) if report.running else 0.0,
            }
        )
    return rows

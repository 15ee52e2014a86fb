"""``llmq demo``: real code-completion prompts through the official ``openai`` SDK against both API pods at once."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass, field

import openai
import redis as redis_sync

from bench.prompts import CodePrompt
from llmq_core import constants
from llmq_core.constants import HTTP_TIMEOUT_MS

DEMO_TIMEOUT_MS = 120_000  # the demo measures queueing too: a burst of long prompts may wait behind each other


@dataclass
class ModelReport:
    model: str
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    mean_batch_size: float = 0.0

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


async def _one(
    client: openai.AsyncOpenAI, prompt: CodePrompt, model: str, report: ModelReport, gate: asyncio.Semaphore
) -> None:
    async with gate:
        started = time.perf_counter()
        try:
            await client.completions.create(
                model=model,
                prompt=prompt.prompt,
                max_tokens=prompt.max_tokens,
                temperature=0,
                extra_headers={HTTP_TIMEOUT_MS: str(DEMO_TIMEOUT_MS)},
            )
        except openai.APIError as exc:
            kind = type(exc).__name__
            report.errors[kind] = report.errors.get(kind, 0) + 1
            return
        report.latencies_s.append(time.perf_counter() - started)


async def run_demo(
    prompts: list[CodePrompt], base_urls: list[str], models: list[str], concurrency: int, api_key: str = "llmq-dev-key"
) -> list[ModelReport]:
    """Send every prompt once, to the models and pods in turn, at most ``concurrency`` in flight."""
    clients = [openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=120) for url in base_urls]
    reports = {model: ModelReport(model) for model in models}
    gate = asyncio.Semaphore(concurrency)
    await asyncio.gather(
        *(
            _one(clients[i % len(clients)], prompt, models[i % len(models)], reports[models[i % len(models)]], gate)
            for i, prompt in enumerate(prompts)
        )
    )
    for client in clients:
        await client.close()
    return list(reports.values())


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
                "mean_batch_size": report.mean_batch_size,
            }
        )
    return rows

"""Burst admission benchmark (issue 13, item 1): N concurrent free-tier completions at once against a stack, and how
well admission's predicted queue wait matched the wait that followed.

Every request is launched at the same moment (max_tokens 64, a share of them streaming, spread over the API pods).
An admitted request carries its prediction in ``x-llmq-predicted-wait-ms``; the client measures its latency to the
last byte. Reported: admitted and 429 counts, when the first 429 came, the prediction error (latency - prediction:
p50/p95 of the absolute error, and the median signed error, which includes the service time), admitted latency p50/p99,
and each 429's Retry-After range. With the pods' /metrics (``--metrics-url``; ``--start-stack`` knows its own), also
``prediction_verdicts``: the burst's admitted requests by how their measured queue wait (their result's
``timings.queued_ms``, free of the client and of the service time) matched the prediction, as the pods counted them in
``llmq_api_admission_predictions_total`` (issue 28's rule: ``within`` max(0.5 x measured, 250 ms); 95% should be).

    llmq bench admission --start-stack --count 3000   # its own stack: two llmq-sim workers x 64 per 500 ms
    llmq bench admission --start-stack --batchers 3 --idle-s 30   # three batchers, after 30 s idle
    llmq bench admission --start-stack --model llmq-tiny --key llmq-dev-key --count 120 --max-tokens 24 --idle-s 30
    llmq bench admission --url http://127.0.0.1:8000 --url http://127.0.0.1:8001   # a running stack

Every connection comes from this one address: a stack's pods cap that at ``LLMQ_API_MAX_CONNECTIONS_PER_CLIENT``
(1024 each by default; the connections past it get 429 ``too_many_connections`` and are closed before the request is
read, which httpx reports as connection errors: 2 x 1024 of a 3,000 burst got through). That cap is right for production,
where one address holding thousands of connections is what it refuses; the private stack (``--start-stack``) lifts it
for this load generator, and a stack given with ``--url`` must allow ``--count`` / pods connections per address.

Not part of ``make test``: a load run, sized by ``--count`` for the machine at hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from llmq_core.constants import HTTP_PREDICTED_WAIT_MS, HTTP_RETRY_AFTER

STACK_PORTS = dict(kafka_port=29092, redis_port=29379, api_ports=(29000, 29001))  # --start-stack: private ports
LOAD_GENERATOR_ENV = {"LLMQ_API_MAX_CONNECTIONS_PER_CLIENT": "0"}  # the burst's connections all come from one address


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: HTTP status, latency (ms, launch to last byte), admission's prediction (admitted) or Retry-After
    (refused), whether it streamed and when its response headers came (ms after launch: a stream's come at admission,
    so what follows them is the wait admission predicted, free of the time the client took to send the burst)."""

    status: int
    latency_ms: float
    predicted_ms: int | None = None
    retry_after_s: int | None = None
    stream: bool = False
    headers_ms: float = 0.0


def percentile(values: list[float], q: float) -> int | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else None


def summary(outcomes: list[Outcome]) -> dict:
    """The figures of one run."""
    ok = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    errors = [abs(o.latency_ms - o.predicted_ms) for o in ok if o.predicted_ms is not None]
    signed = [o.latency_ms - o.predicted_ms for o in ok if o.predicted_ms is not None]
    streamed = [o for o in ok if o.stream and o.predicted_ms is not None]
    after = [o.latency_ms - o.headers_ms - o.predicted_ms for o in streamed]
    return {
        "requests": len(outcomes),
        "admitted": len(ok),
        "refused_429": len(refused),
        "other": len(outcomes) - len(ok) - len(refused),
        "first_429_ms": percentile([o.latency_ms for o in refused], 0),
        "prediction_abs_error_ms": {"p50": percentile(errors, 0.5), "p95": percentile(errors, 0.95)},
        "prediction_signed_error_p50_ms": round(statistics.median(signed)) if signed else None,
        "admitted_latency_ms": {
            "p50": percentile([o.latency_ms for o in ok], 0.5),
            "p99": percentile([o.latency_ms for o in ok], 0.99),
            "max": percentile([o.latency_ms for o in ok], 1),
        },
        "answered_429_ms": {
            "p50": percentile([o.latency_ms for o in refused], 0.5),
            "max": percentile([o.latency_ms for o in refused], 1),
        },
        "streamed_after_admission": {
            "count": len(streamed),
            "prediction_abs_error_ms": {
                "p50": percentile([abs(e) for e in after], 0.5),
                "p95": percentile([abs(e) for e in after], 0.95),
            },
            "prediction_signed_error_p50_ms": round(statistics.median(after)) if after else None,
            "latency_ms": {
                "p50": percentile([o.latency_ms - o.headers_ms for o in streamed], 0.5),
                "p99": percentile([o.latency_ms - o.headers_ms for o in streamed], 0.99),
            },
        },
        "retry_after_s": {
            "min": min((o.retry_after_s for o in refused), default=None),
            "max": max((o.retry_after_s for o in refused), default=None),
        },
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """What each request of the burst asks: ``count`` at once, every ``1 / stream_share``-th streamed, from ``key``;
    ``idle_s`` seconds after the warm-up left the queues (the meters' rates are measured from what ran before)."""

    count: int
    stream_share: float
    max_tokens: int
    key: str
    model: str
    idle_s: float


async def one(client: httpx.AsyncClient, url: str, spec: Burst, stream: bool, start: float) -> Outcome:
    body = {"model": spec.model, "prompt": "a burst of work", "max_tokens": spec.max_tokens, "stream": stream}
    try:
        async with client.stream(
            "POST", f"{url}/v1/completions", json=body, headers={"authorization": f"Bearer {spec.key}"}
        ) as response:
            headers_ms = (time.monotonic() - start) * 1000
            await response.aread()
    except httpx.HTTPError:
        return Outcome(0, (time.monotonic() - start) * 1000)
    headers = response.headers
    return Outcome(
        response.status_code,
        (time.monotonic() - start) * 1000,
        int(headers[HTTP_PREDICTED_WAIT_MS]) if HTTP_PREDICTED_WAIT_MS in headers else None,
        int(headers[HTTP_RETRY_AFTER]) if HTTP_RETRY_AFTER in headers else None,
        stream,
        headers_ms,
    )


async def burst(urls: list[str], spec: Burst) -> list[Outcome]:
    every = round(1 / spec.stream_share) if spec.stream_share else 0
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=spec.count + 10)) as client:
        start = time.monotonic()
        return await asyncio.gather(
            *(one(client, urls[i % len(urls)], spec, bool(every) and i % every == 0, start) for i in range(spec.count))
        )


async def warm_up(urls: list[str], spec: Burst) -> None:
    """Until every pod serves a paid request of the burst's model (workers heard, reports read), then ``idle_s``."""
    probe = dataclasses.replace(spec, count=1, stream_share=0, max_tokens=1, key="llmq-dev-key")
    async with httpx.AsyncClient(timeout=60) as client:
        for url in urls:
            deadline = time.monotonic() + 120
            while (await one(client, url, probe, False, time.monotonic())).status != 200:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} never served a request")
                await asyncio.sleep(1)
    await asyncio.sleep(spec.idle_s)


PREDICTIONS_METRIC = "llmq_api_admission_predictions_total"


def prediction_verdicts(text: str) -> Counter[str]:
    """verdict -> admitted requests counted in a pod's /metrics ``text`` (Prometheus' text format), every class."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith(PREDICTIONS_METRIC + "{") and 'verdict="' in line:
            verdict = line.split('verdict="', 1)[1].split('"', 1)[0]
            counts[verdict] += round(float(line.rsplit(" ", 1)[1]))
    return counts


def verdict_figures(before: Counter[str], after: Counter[str]) -> dict:
    """The verdicts counted between two scrapes, and the share of them ``within``."""
    delta = {v: after[v] - before[v] for v in ("within", "under", "over")}
    total = sum(delta.values())
    return {**delta, "within_share": round(delta["within"] / total, 3) if total else None}


async def scrape(metrics_urls: list[str]) -> Counter[str]:
    """The pods' verdict counts, summed."""
    counts: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=10) as client:
        for url in metrics_urls:
            counts += prediction_verdicts((await client.get(f"{url}/metrics")).text)
    return counts


async def run(urls: list[str], spec: Burst, metrics_urls: list[str] = ()) -> dict:
    """Warm every pod up, wait ``spec.idle_s``, launch the burst, and return its figures (with ``metrics_urls``, the
    pods' verdicts on their predictions: a result is counted when it arrives, before its response ends)."""
    await warm_up(urls, spec)
    before = await scrape(list(metrics_urls))
    figures = {"burst": dataclasses.asdict(spec), **summary(await burst(urls, spec))}
    if metrics_urls:
        figures["prediction_verdicts"] = verdict_figures(before, await scrape(list(metrics_urls)))
    return figures

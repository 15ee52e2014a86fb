"""Open-loop load generator for OpenAI-compatible ``/v1/completions`` endpoints (llmq's API pods, or a peer).

Arrivals are a Poisson process at a set rate: every request is launched at its scheduled time whether or not earlier
ones have finished, so a slow system faces a growing backlog instead of a politely waiting client (no coordinated
omission: latency counts from the scheduled time). A run is bounded by a request count and a duration and ends by
itself once every launched request has an answer or hit the client timeout.

Pure parts (schedule, plan, summary) are separate from the HTTP part (:func:`run_load`), so they can be tested alone.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import redis as redis_sync

from llmq_bench.prompts import CodePrompt
from llmq_core.constants import HTTP_TIMEOUT_MS, HTTP_TRAFFIC_CLASS
from llmq_core.status import ErrorCode, ErrorType

DEFAULT_KEYS = {"llmq-dev-key": 0.8, "llmq-dev-free-key": 0.2}  # tenants: paid and free tier
OK = "ok"
TIMEOUT = "timeout"  # the client gave up (its own timeout), no answer
ERROR = "error"  # connection failure or an unreadable answer


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of a run: when (``at_s`` after the start), what, for whom and where."""

    at_s: float
    prompt: str
    max_tokens: int
    traffic_class: str
    api_key: str
    stream: bool
    base_url: str


@dataclass(frozen=True, slots=True)
class Sample:
    """What happened to one request. ``status``: ``ok``, an HTTP status (``"429"``, ``"504"``...), ``timeout`` or
    ``error``; ``e2e_ms`` from its scheduled time to its last byte; ``ttft_ms`` to its first text (streams only);
    ``end_s``: when it ended, seconds after the run's start; ``detail``: what went wrong, for any status but ``ok``
    (a server's error, answered or in a stream: its status and code, :func:`error_detail`)."""

    planned: Planned
    status: str
    e2e_ms: float
    end_s: float
    ttft_ms: float | None = None
    detail: str = ""


def parse_weights(text: str) -> dict[str, float]:
    """``"a=0.8,b=0.2"`` -> ``{"a": 0.8, "b": 0.2}``; a bare name weighs 1.

    Raises ValueError on a negative or all-zero mix.
    """
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        weights[name.strip()] = float(weight) if weight else 1.0
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"bad weights {text!r}: want name=weight,... with weights >= 0 and not all 0")
    return weights


def poisson_arrivals(rate_rps: float, *, count: int, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival offsets (s, ascending) of a Poisson process at ``rate_rps``: at most ``count``, all before
    ``duration_s``.

    Raises ValueError for a rate that is not positive.
    """
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    arrivals, at_s = [], 0.0
    while len(arrivals) < count:
        at_s += rng.expovariate(rate_rps)
        if at_s >= duration_s:
            break
        arrivals.append(at_s)
    return arrivals


def arrival_window_s(arrivals: Sequence[float], count: int, duration_s: float) -> float:
    """Seconds the arrivals span: ``duration_s``, or up to the last arrival when the count bound ended them first."""
    return arrivals[-1] if arrivals and len(arrivals) >= count else duration_s


def plan_requests(
    prompts: Sequence[CodePrompt],
    arrivals: Sequence[float],
    *,
    classes: dict[str, float],
    keys: dict[str, float],
    stream_share: float,
    base_urls: Sequence[str],
    rng: random.Random,
) -> list[Planned]:
    """One request per arrival: prompts in turn (cycling), pods in turn, class / key / streaming drawn by weight."""
    class_names, class_weights = list(classes), list(classes.values())
    key_names, key_weights = list(keys), list(keys.values())
    return [
        Planned(
            at_s=at_s,
            prompt=prompts[i % len(prompts)].prompt,
            max_tokens=prompts[i % len(prompts)].max_tokens,
            traffic_class=rng.choices(class_names, class_weights)[0],
            api_key=rng.choices(key_names, key_weights)[0],
            stream=rng.random() < stream_share,
            base_url=base_urls[i % len(base_urls)],
        )
        for i, at_s in enumerate(arrivals)
    ]


# --- summary -------------------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) by nearest rank: the smallest value with at least q% of values at or below
    it; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p95 / p99 (nearest rank) and mean of ``values`` (ms); all 0.0 for no values."""
    values = list(values)
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else 0.0,
    }


def group_figures(samples: Sequence[Sample], slo_ms: float) -> dict:
    """Counts (requests, succeeded, good within ``slo_ms``, 429, 504, by status) and latency / TTFT quantiles of the
    succeeded ones, of one group of samples (all zeros for none)."""
    ok = [s for s in samples if s.status == OK]
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[s.status] = statuses.get(s.status, 0) + 1
    return {
        "requests": len(samples),
        "succeeded": len(ok),
        "good": sum(s.e2e_ms <= slo_ms for s in ok),
        "rejected_429": statuses.get("429", 0),
        "timeouts_504": statuses.get("504", 0),
        "status": statuses,
        "latency_ms": quantiles_ms([s.e2e_ms for s in ok]),
        "ttft_ms": quantiles_ms([s.ttft_ms for s in ok if s.ttft_ms is not None]),
    }


def summarize(
    samples: Sequence[Sample],
    *,
    window_s: float,
    slo_ms: float,
    batch_delta: tuple[int, int] | None = None,
    max_batch_size: int = 64,
) -> dict:
    """The report of a run, as plain JSON-ready data.

    ``window_s``: the arrival window (offered and goodput rates are per second of it); ``slo_ms``: a succeeded request
    is good when its end-to-end latency is at most this; ``batch_delta``: (batches, requests) dispatched during the run,
    when known. Goodput counts good requests; ``throughput_rps`` counts every success over the time until the last one
    ended (under overload: the rate the system really served). Latency and TTFT quantiles cover succeeded requests.
    """
    overall = group_figures(samples, slo_ms)
    last_end_s = max((s.end_s for s in samples if s.status == OK), default=0.0)
    report = {
        **overall,
        "window_s": window_s,
        "slo_ms": slo_ms,
        "offered_rps": len(samples) / window_s if window_s else 0.0,
        "goodput_rps": overall["good"] / window_s if window_s else 0.0,
        "goodput_ratio": overall["good"] / len(samples) if samples else 0.0,
        "throughput_rps": overall["succeeded"] / last_end_s if last_end_s else 0.0,
        "classes": {
            cls: group_figures([s for s in samples if s.planned.traffic_class == cls], slo_ms)
            for cls in sorted({s.planned.traffic_class for s in samples})
        },
        "tenants": {
            key: group_figures([s for s in samples if s.planned.api_key == key], slo_ms)
            for key in sorted({s.planned.api_key for s in samples})
        },
        "errors": _top_details(samples),
        "batches": None,
    }
    if batch_delta is not None:
        batches, requests = batch_delta
        mean_size = requests / batches if batches else 0.0
        report["batches"] = {
            "batches": batches,
            "requests": requests,
            "mean_size": mean_size,
            "max_batch_size": max_batch_size,
            "fill": mean_size / max_batch_size,
        }
    return report


def _top_details(samples: Sequence[Sample], top: int = 5) -> dict[str, int]:
    """The most frequent failure details (client-side errors and timeouts, HTTP errors' codes) with their counts."""
    counts: dict[str, int] = {}
    for s in samples:
        if s.detail:
            counts[s.detail] = counts.get(s.detail, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1])[:top])


def batch_counts(redis_url: str, key: str) -> tuple[int, int]:
    """(batches, requests) from the stats hash ``key`` (the batcher's HINCRBY counters); (0, 0) when absent."""
    client = redis_sync.Redis.from_url(redis_url, socket_timeout=2)
    try:
        stats = client.hgetall(key)
    finally:
        client.close()
    return int(stats.get(b"batches", 0)), int(stats.get(b"requests", 0))


def batch_delta(
    read: Callable[[], tuple[int, int]],
    before: tuple[int, int],
    served: int,
    *,
    timeout_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, int]:
    """(batches, requests) counted by ``read`` since ``before``, read until the ``served`` requests are counted or
    ``timeout_s`` passes: the batcher writes its counters once a second (SATURATION_REPORT_INTERVAL_MS), so a read
    right after the last answer can miss up to a second of them."""
    deadline = clock() + timeout_s
    while True:
        after = read()
        delta = (after[0] - before[0], after[1] - before[1])
        if delta[1] >= served or clock() >= deadline:
            return delta
        sleep(0.1)


# --- HTTP ----------------------------------------------------------------------------------------------------------
# aiohttp, not httpx: at 64 in flight against a trivial uvicorn app, httpx took 2.4-4.4 ms of client CPU per request
# and aiohttp 0.12-0.19 ms (time.process_time over 3,000 POSTs), and the load generator shares the cores with the
# system it measures.


# How long an idle connection is kept for the next request: well under the servers' own idle timeout (uvicorn's and
# the API pods' 5 s, LLMQ_API_KEEP_ALIVE_TIMEOUT_MS). aiohttp's default, 15 s, reused connections the server was
# closing: the request written as the server's keep-alive timer fired failed as ServerDisconnectedError, never
# reaching the server (1 of 598 requests in a make compose-test run; a third of them with the idle time at the timeout).
KEEPALIVE_S = 1.0


def client_session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    """A keep-alive session of at most ``limit`` connections, each idle for at most KEEPALIVE_S; ``timeout_s`` bounds
    the wait for a connection (pool included) and each read, as httpx's ``timeout=`` did: a long stream that keeps
    sending is not cut."""
    timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


def json_body(body: dict) -> bytes:
    """``body`` encoded once, compactly (the bytes httpx's ``json=`` sent)."""
    return json.dumps(body, separators=(",", ":")).encode()


async def run_load(
    plans: Sequence[Planned],
    *,
    model: str,
    timeout_s: float = 60.0,
    server_timeout_ms: int | None = None,
    on_sent: Callable[[], None] | None = None,
    on_done: Callable[[Sample], None] | None = None,
    max_connections: int = 4096,
) -> list[Sample]:
    """Send ``plans`` on schedule (open loop) and return one Sample per plan, in plan order.

    ``server_timeout_ms`` goes out as the ``x-llmq-timeout-ms`` header; ``timeout_s`` bounds each request's connect
    and each of its reads on the client. One session (``max_connections`` connections) per base URL.
    """
    sessions = {url: client_session(max_connections, timeout_s) for url in sorted({p.base_url for p in plans})}
    loop = asyncio.get_running_loop()
    start_s = loop.time()
    tasks: list[asyncio.Task[Sample]] = []
    try:
        for plan in plans:
            due_s = start_s + plan.at_s
            await asyncio.sleep(max(0.0, due_s - loop.time()))
            task = loop.create_task(_send(sessions[plan.base_url], plan, model, due_s, start_s, server_timeout_ms))
            if on_done is not None:
                task.add_done_callback(lambda t: t.cancelled() or on_done(t.result()))
            tasks.append(task)
            if on_sent is not None:
                on_sent()
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*(session.close() for session in sessions.values()))


async def wait_ready(
    base_urls: Sequence[str],
    timeout_s: float,
    *,
    poll_s: float = 1.0,
    probe_timeout_s: float = 5.0,
    path: str = "/readyz",
) -> None:
    """Return once ``GET <pod><path>`` answers 200 at every base URL's pod (the URL without its ``/v1``): the pod's
    readiness probe, which needs no API key. A probe unanswered within ``probe_timeout_s`` counts as not ready (apart
    from ``poll_s``: a short poll must not cut off a slow answer). Raises TimeoutError after ``timeout_s``."""
    async with client_session(1, probe_timeout_s) as session, asyncio.timeout(timeout_s):
        for url in base_urls:
            while not await _ready(session, f"{url.removesuffix('/v1')}{path}"):
                await asyncio.sleep(poll_s)


async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _send(
    session: aiohttp.ClientSession,
    plan: Planned,
    model: str,
    due_s: float,
    start_s: float,
    server_timeout_ms: int | None,
) -> Sample:
    loop = asyncio.get_running_loop()
    body = {
        "model": model,
        "prompt": plan.prompt,
        "max_tokens": plan.max_tokens,
        "temperature": 0,
        "stream": plan.stream,
    }
    headers = {
        "authorization": f"Bearer {plan.api_key}",
        HTTP_TRAFFIC_CLASS: plan.traffic_class,
        "content-type": "application/json",
    }
    if server_timeout_ms is not None:
        headers[HTTP_TIMEOUT_MS] = str(server_timeout_ms)
    ttft_s: float | None = None
    detail = ""
    try:
        async with session.post(f"{plan.base_url}/completions", data=json_body(body), headers=headers) as response:
            if plan.stream and response.status == 200:
                status, ttft_s, detail = await _stream(response, loop)
            else:
                raw = await response.read()
                status = OK if response.status == 200 else str(response.status)
                detail = "" if status == OK else error_detail(status, raw)
    except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
        status, detail = TIMEOUT, type(exc).__name__
    except (aiohttp.ClientError, ValueError) as exc:
        status, detail = ERROR, f"{type(exc).__name__}: {exc}"[:200]
    end_s = loop.time()
    ttft_ms = (ttft_s - due_s) * 1000 if ttft_s is not None and status == OK else None
    return Sample(
        planned=plan,
        status=status,
        e2e_ms=(end_s - due_s) * 1000,
        end_s=end_s - start_s,
        ttft_ms=ttft_ms,
        detail=detail,
    )


def error_detail(status: str, raw: bytes) -> str:
    """What an HTTP error answer says, for the report's error counts: its status and its error object's code (or
    type), e.g. ``503 worker_unavailable``; the status alone for a body that is not an error object."""
    try:
        error = json.loads(raw)["error"]
        return f"{status} {error.get('code') or error.get('type') or 'error'}"
    except (ValueError, KeyError, TypeError, AttributeError):
        return status


async def _stream(response: aiohttp.ClientResponse, loop) -> tuple[str, float | None, str]:
    """(status, loop time of the first text, detail) of an SSE completion answered 200; an ``{"error": ...}`` event
    maps to its status, its detail as an HTTP error's (:func:`error_detail`)."""
    first_text_s = None
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return OK, first_text_s, ""
        event = json.loads(data)
        if "error" in event:
            status = stream_error_status(event["error"])
            return status, None, error_detail(status, data.encode())
        if first_text_s is None and any(c.get("text") for c in event.get("choices", ())):
            first_text_s = loop.time()
    return ERROR, None, "the stream ended without [DONE]"


def stream_error_status(error: dict) -> str:
    """The HTTP status an SSE error event stands for (the stream itself already answered 200)."""
    code, kind = error.get("code"), error.get("type")
    if code == ErrorCode.DEADLINE_EXCEEDED:
        return "504"
    if code in (ErrorCode.RATE_LIMIT_EXCEEDED, ErrorType.OVERLOADED) or kind in (
        ErrorType.RATE_LIMIT,
        ErrorType.OVERLOADED,
    ):
        return "429"
    return f"stream_{code or kind or 'error'}"

"""Burst admission through a real stack (issue 13, item 1): API pod, batcher, one llmq-sim worker (8 slots x 500 ms,
16 requests/s) and the result-router on the suite's Kafka and Redis.

300 free-tier completions arrive at once with 20 paid ones beside them. The free tier's shed wait is lowered to 2 s
(the rule under test is the same as the default 5 s): the wait predicted from the work queued ahead (at least the pod's
unfinished requests less the 8 slots, before the batcher has read them) over the drain rate (half the promised 16/s
until one is measured) crosses it after about 24 requests, so 429s start within the burst's first second (the oldest
queued age, the signal before, only saw a burst seconds later), every 429's Retry-After is its prediction rounded up,
the admitted free requests finish near the limit, and every paid request succeeds.
"""

from __future__ import annotations

import asyncio
import math
import re
import time

import httpx
import pytest

from llmq_core import constants
from tests import ports
from tests.stacks import shed_wait_env, sim_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]  # latency bounds: the machine to itself

API_PORT = ports.block()
FREE_LIMIT_MS = 2000
SHED_WAIT_MS = {
    "interactive:paid": 15_000,
    "interactive:free": FREE_LIMIT_MS,
    "near_interactive": 2000,
    "deferred": 1000,
}
BATCH_TIME_MS, SLOTS = 500, 8
FREE_BURST, PAID_BESIDE = 300, 20
PREDICTED = re.compile(r"predicted queue wait (\d+) ms")


@pytest.fixture(scope="module")
def stack(infra):
    with sim_stack(
        infra, (API_PORT,), batch_time_ms=BATCH_TIME_MS, sim_max_batch_size=SLOTS, extra_env=shed_wait_env(SHED_WAIT_MS)
    ) as running:
        yield running


async def complete(client: httpx.AsyncClient, key: str, started: float) -> tuple[httpx.Response, float]:
    """One llmq-sim completion; returns the response and when it ended (s after ``started``)."""
    response = await client.post(
        f"http://127.0.0.1:{API_PORT}/v1/completions",
        headers={"authorization": f"Bearer {key}", "x-llmq-timeout-ms": "30000"},
        json={"model": "llmq-sim", "prompt": "burst", "max_tokens": 4},
    )
    return response, time.monotonic() - started


async def warm_up(client: httpx.AsyncClient) -> None:
    """Until the worker serves (its heartbeat reached the batcher and its report reached the pod)."""
    deadline = time.monotonic() + 60
    while (await complete(client, "llmq-dev-key", time.monotonic()))[0].status_code != 200:
        assert time.monotonic() < deadline, "the stack never served a request"
        await asyncio.sleep(0.5)


async def test_a_free_tier_burst_is_shed_from_its_start_by_predicted_wait_and_paid_requests_beside_it_succeed(stack):
    limits = httpx.Limits(max_connections=FREE_BURST + PAID_BESIDE)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await warm_up(client)
        started = time.monotonic()
        every = (FREE_BURST + PAID_BESIDE) // PAID_BESIDE  # paid requests spread through the burst
        keys = ["llmq-dev-key" if i % every == 0 else "llmq-dev-free-key" for i in range(FREE_BURST + PAID_BESIDE)]
        answers = await asyncio.gather(*(complete(client, key, started) for key in keys))
    free = [(r, t) for (r, t), key in zip(answers, keys) if key == "llmq-dev-free-key"]
    paid = [(r, t) for (r, t), key in zip(answers, keys) if key == "llmq-dev-key"]
    refused = [(r, t) for r, t in free if r.status_code == 429]
    admitted = [(r, t) for r, t in free if r.status_code == 200]
    print(
        f"burst: {len(free)} free ({len(admitted)} admitted, {len(refused)} refused), {len(paid)} paid; "
        f"first 429 after {min(t for _, t in refused):.2f} s; admitted free max {max(t for _, t in admitted):.2f} s"
    )
    print(
        "admitted free (predicted ms, ended s):",
        sorted((int(r.headers[constants.HTTP_PREDICTED_WAIT_MS]), round(t, 2)) for r, t in admitted),
    )
    assert {r.status_code for r, _ in paid} == {200}, [r.text for r, _ in paid if r.status_code != 200]
    assert {r.status_code for r, _ in free} == {200, 429}
    assert min(t for _, t in refused) < 1.5  # as soon as the prediction crosses 2 s, not seconds later
    for response, _ in refused:
        predicted_ms = int(PREDICTED.search(response.json()["error"]["message"]).group(1))
        assert predicted_ms > FREE_LIMIT_MS
        assert response.headers["retry-after"] == str(min(60, math.ceil(predicted_ms / 1000)))
    for response, _ in admitted:
        assert int(response.headers[constants.HTTP_PREDICTED_WAIT_MS]) <= FREE_LIMIT_MS
    # admitted: about 2 s of work (16 at 8/s, plus 8 slots) plus what drained while the burst arrived. Each waited near
    # the limit (the burst's own arrival on a shared machine, a 500 ms batch, a pipeline below the nominal rate in the
    # first second); admitting them all would have had the last wait 300 / 16 = 19 s.
    assert len(admitted) < FREE_BURST / 3
    assert max(t for _, t in admitted) < FREE_BURST / (SLOTS * 1000 / BATCH_TIME_MS) / 2

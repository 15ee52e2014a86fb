"""Fakes of the worker's unit tests: hand-driven time and request builders (unique module name: no clash on sys.path)."""

from __future__ import annotations

import asyncio
import heapq
import itertools

from llmq_core.clock import FakeClock
from llmq_core.wire import ChatMessage, GenerationRequest, HttpReply, SamplingParams

T0_MS = 1_700_000_000_000


class ManualTime:
    """A clock plus an async ``sleep`` that returns only when the test advances time past its wake-up."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0_MS)
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    async def sleep(self, seconds: float) -> None:
        target = self.clock.now_ms() + round(seconds * 1000)
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (target, next(self._order), future))
        await future

    async def advance(self, ms: int) -> None:
        """Move time forward by ``ms``, waking sleepers in order and letting the loop run after each."""
        end = self.clock.now_ms() + ms
        await settle()
        while self._waiters and self._waiters[0][0] <= end:
            target, _, future = heapq.heappop(self._waiters)
            self.clock.set(max(target, self.clock.now_ms()))
            future.set_result(None)
            await settle()
        self.clock.set(end)
        await settle()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def make_request(
    request_id: str = "r1",
    prompt: str | None = "abc",
    *,
    messages: list[tuple[str, str]] | None = None,
    max_tokens: int = 5,
    stop: list[str] | None = None,
    n: int = 1,
    stream: bool = True,
    model: str = "llmq-sim",
    created_ms: int = T0_MS,
    deadline_ms: int = T0_MS + 60_000,
    attempt: int = 0,
    temperature: float = 0.0,
    seed: int | None = None,
    logit_bias: dict[int, float] | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        model=model,
        endpoint="chat.completions" if messages else "completions",
        prompt=None if messages else prompt,
        messages=[ChatMessage(role=r, content=c) for r, c in messages] if messages else None,
        sampling=SamplingParams(
            max_tokens=max_tokens, stop=stop or [], n=n, temperature=temperature, seed=seed, logit_bias=logit_bias
        ),
        stream=stream,
        created_ms=created_ms,
        deadline_ms=deadline_ms,
        reply_to=HttpReply(instance_id="pod-1"),
        attempt=attempt,
    )

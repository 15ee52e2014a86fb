"""Fakes of the worker's unit tests: hand-driven time, request and batch builders, a step engine, a scripted vLLM."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from types import SimpleNamespace

import msgspec

from llmq_core.clock import FakeClock
from llmq_core.status import ErrorCode
from llmq_core.tokenizer import encode
from llmq_core.wire import (
    Batch,
    ChatMessage,
    Choice,
    Continuation,
    GenerationRequest,
    HttpReply,
    Outcome,
    SamplingParams,
    Usage,
)
from llmq_worker import logprobs
from llmq_worker.engine import Capacity, ChunkEvent, FinalEvent, InvalidRequest, prompt_text
from llmq_worker.engines.vllm_engine import VllmEngine
from llmq_worker.text import ChoiceText

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
    logprobs: int | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        model=model,
        endpoint="chat.completions" if messages else "completions",
        prompt=None if messages else prompt,
        messages=[ChatMessage(role=r, content=c) for r, c in messages] if messages else None,
        sampling=SamplingParams(
            max_tokens=max_tokens,
            stop=stop or [],
            n=n,
            temperature=temperature,
            seed=seed,
            logit_bias=logit_bias,
            logprobs=logprobs,
        ),
        stream=stream,
        created_ms=created_ms,
        deadline_ms=deadline_ms,
        reply_to=HttpReply(instance_id="pod-1"),
        attempt=attempt,
    )


def resumed(request: GenerationRequest, *token_ids: list[int]) -> GenerationRequest:
    """``request`` re-dispatched as a continuation: choice i already generated ``token_ids[i]``."""
    return msgspec.structs.replace(request, continuation=Continuation(token_ids=list(token_ids)))


def batch(*requests, batch_id="b1") -> Batch:
    return Batch(
        batch_id=batch_id,
        worker_id="w1",
        model="llmq-sim",
        requests=list(requests),
        formed_ms=T0_MS,
        flush_reason="size",
    )


class StepEngine:
    """Runs everything submitted as one step when told; a step holding a poisoned prompt fails as a whole."""

    fixed_batch_time_ms = 0
    context_window = 100

    def __init__(self, clock: FakeClock, poison: str = "POISON") -> None:
        self.clock = clock
        self.poison = poison
        self.submitted: dict[str, object] = {}
        self.canceled: list[str] = []
        self.steps: list[list[str]] = []

    def submit(self, request) -> None:
        if request.sampling.max_tokens > self.context_window:
            raise InvalidRequest("too long", "max_tokens", ErrorCode.CONTEXT_LENGTH_EXCEEDED)
        self.submitted[request.request_id] = request

    def cancel(self, request_id: str) -> None:
        self.canceled.append(request_id)

    def capacity(self) -> Capacity:
        return Capacity(max_slots=8, running=len(self.submitted), queued=0, est_drain_ms=0)

    def step(self) -> list:
        """One step: chunk + final per request (or a shared failure of all of them)."""
        requests, self.submitted = list(self.submitted.values()), {}
        self.steps.append([r.request_id for r in requests])
        self.clock.advance(10)
        if any(self.poison in r.prompt for r in requests):
            return [self.final(r, Outcome.ERRORED, "", shared_failure=True) for r in requests]
        events = [ChunkEvent(r.request_id, 0, r.prompt) for r in requests]
        return events + [self.final(r, Outcome.SUCCEEDED, r.prompt) for r in requests]

    def stop(self, request_id: str) -> list:
        """The FinalEvent a canceled running request gets."""
        request = self.submitted.pop(request_id)
        return [self.final(request, Outcome.CANCELED, "")]

    def final(self, request, outcome, text, shared_failure=False) -> FinalEvent:
        now = self.clock.now_ms()
        return FinalEvent(
            request_id=request.request_id,
            outcome=outcome,
            choices=[Choice(index=0, text=text)],
            usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
            started_ms=now - 10,
            first_token_ms=now - 5,
            finished_ms=now,
            shared_failure=shared_failure,
        )


class ScriptedClient:
    """Stands in for AsyncLLM.generate/errored/shutdown: each request streams its prompt back one token per output
    (cumulative text and ids), ``stop`` after ``max_tokens`` or at a prompt holding "STOP", waiting while ``paused``."""

    def __init__(self) -> None:
        self.errored = False
        self.fail_with: Exception | None = None
        self.paused = asyncio.Event()
        self.paused.set()
        self.started: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, prompt_ids, params, request_id):
        self.started.append(request_id)
        ids = []
        try:
            for token in prompt_ids[: params["max_tokens"]]:
                await self.paused.wait()
                if self.fail_with is not None:
                    raise self.fail_with
                ids.append(token)
                text = bytes(t - 3 for t in ids).decode("utf-8", errors="replace")
                done = len(ids) == min(len(prompt_ids), params["max_tokens"])
                reason = ("length" if len(ids) == params["max_tokens"] else "stop") if done else None
                out = SimpleNamespace(text=text, token_ids=list(ids), finish_reason=reason, stop_reason=None)
                if params.get("logprobs") is not None:  # vLLM's: the chosen id and the top ones, by id
                    out.logprobs = [_scripted_logprobs(t, k) for k, t in enumerate(ids)]
                yield SimpleNamespace(outputs=[out])
                await asyncio.sleep(0)
        except (asyncio.CancelledError, GeneratorExit):  # as AsyncLLM.generate: both abort the request
            self.aborted.append(request_id)
            raise

    def shutdown(self) -> None:
        pass


def _scripted_logprobs(token_id: int, position: int) -> dict:
    """The k-th token is the most likely at -0.1 - k/100; the id after it comes next at -3, and "z" at -5."""
    return {
        token_id: SimpleNamespace(logprob=-0.1 - position / 100),
        token_id + 1: SimpleNamespace(logprob=-3.0),
        3 + ord("z"): SimpleNamespace(logprob=-5.0),
    }


class ByteCodec:
    token_bytes = staticmethod(logprobs.byte_token_bytes)

    def prompt_ids(self, request):
        return encode(prompt_text(request))

    def text_size(self, token_id: int) -> int:
        return len(logprobs.byte_token_bytes(token_id)) if token_id >= 3 else 0

    def choice(self, stops, budget, logprobs=None) -> ChoiceText:
        return ChoiceText(stops, budget=budget, logprobs=logprobs is not None)


def scripted_vllm(client: ScriptedClient, **overrides) -> VllmEngine:
    """A VllmEngine over ``client`` with the byte codec: 2 slots, a 64-token window, plain dicts as parameters."""
    settings = {"make_params": dict, "make_prompt": list, "max_num_seqs": 2, "context_window": 64, "vocab_size": 259}
    return VllmEngine(client, ByteCodec(), **(settings | overrides))


async def drain(engine, count: int) -> tuple[dict[str, FinalEvent], dict[tuple[str, int], str]]:
    finals, streamed = {}, {}
    async with asyncio.timeout(5):
        while len(finals) < count:
            for event in await engine.next_events():
                if isinstance(event, ChunkEvent):
                    streamed[(event.request_id, event.index)] = (
                        streamed.get((event.request_id, event.index), "") + event.text
                    )
                else:
                    finals[event.request_id] = event
    return finals, streamed

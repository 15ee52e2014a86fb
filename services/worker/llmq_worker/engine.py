"""The one interface every worker engine implements, and the events it streams.

An engine takes GenerationRequests (:meth:`Engine.submit`), runs them however it batches, and reports progress as events:
:class:`ChunkEvent` (new visible text of one choice) and exactly one :class:`FinalEvent` per submitted request.
Times in events are epoch milliseconds from the engine's clock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmq_core.constants import MAX_LOGIT_BIAS_TOKENS
from llmq_core.tokenizer import render_chat
from llmq_core.wire import Choice, ErrorInfo, GenerationRequest, Outcome, Usage


class InvalidRequest(ValueError):
    """Raised by :meth:`Engine.submit` when a request can never run (e.g. longer than the context window)."""


@dataclass(frozen=True, slots=True)
class ChunkEvent:
    """New visible text of choice ``index`` of ``request_id`` (never part of a UTF-8 character or of a stop string)."""

    request_id: str
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class FinalEvent:
    """The end of a request on the engine.

    ``started_ms``: the engine began computing it; ``first_token_ms``: its first token (0: none); ``finished_ms``: end.
    ``shared_failure``: the engine failed a whole step this request was part of, so the culprit is unknown (the worker
    bisects); otherwise an ERRORED outcome is this request's own fault.
    """

    request_id: str
    outcome: Outcome
    choices: list[Choice]
    usage: Usage
    started_ms: int
    first_token_ms: int
    finished_ms: int
    error: ErrorInfo | None = None
    shared_failure: bool = False


EngineEvent = ChunkEvent | FinalEvent


@dataclass(frozen=True, slots=True)
class Capacity:
    """Slots of an engine: ``free_slots`` = ``max_slots`` - running - queued (floored at 0); ``est_drain_ms`` until idle."""

    max_slots: int
    running: int
    queued: int
    est_drain_ms: int

    @property
    def free_slots(self) -> int:
        return max(0, self.max_slots - self.running - self.queued)


class Engine(Protocol):
    """A generation engine. ``submit``/``cancel`` never block; results arrive through :meth:`next_events`."""

    fixed_batch_time_ms: int  # > 0 for a fixed-time batch engine, else 0
    context_window: int  # tokens, prompt + completion

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request``; raises :class:`InvalidRequest` if it can never run. Exactly one FinalEvent follows."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop ``request_id``: a queued one never starts, a running one ends ``canceled`` within one step. Unknown ids: no-op."""
        ...

    async def next_events(self) -> list[EngineEvent]:
        """Wait for at least one event; returns every event ready now, in order."""
        ...

    def capacity(self) -> Capacity:
        """Current slots, for heartbeats and backpressure."""
        ...

    async def close(self) -> None:
        """Stop the engine; requests still running get no further events."""
        ...


class EventQueue:
    """The event stream engines share: ``put`` from the engine's loop, ``next_events`` drains in batches."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def put(self, event: EngineEvent) -> None:
        self._queue.put_nowait(event)

    async def next_events(self) -> list[EngineEvent]:
        events = [await self._queue.get()]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events


class TokenRate:
    """Generated tokens/s, smoothed with a half-life (measured over windows of at least ``window_s``), for est_drain_ms."""

    def __init__(
        self, half_life_s: float = 2.0, window_s: float = 0.25, monotonic: Callable[[], float] = time.monotonic
    ):
        self._half_life_s = half_life_s
        self._window_s = window_s
        self._monotonic = monotonic
        self._tokens = 0
        self._mark = (monotonic(), 0)
        self.tokens_per_s = 0.0

    def add(self, count: int) -> None:
        """``count`` more tokens were generated now."""
        self._tokens += count
        now = self._monotonic()
        mark_s, mark_tokens = self._mark
        if now - mark_s < self._window_s:
            return
        rate = (self._tokens - mark_tokens) / (now - mark_s)
        weight = 0.5 ** ((now - mark_s) / self._half_life_s)
        self.tokens_per_s = rate if not self.tokens_per_s else weight * self.tokens_per_s + (1 - weight) * rate
        self._mark = (now, self._tokens)

    def drain_ms(self, tokens_left: int) -> int:
        """Milliseconds to generate ``tokens_left`` at the current rate (0 while unmeasured or nothing is left)."""
        if self.tokens_per_s <= 0 or tokens_left <= 0:
            return 0
        return math.ceil(1000 * tokens_left / self.tokens_per_s)


def prompt_text(request: GenerationRequest) -> str:
    """The text the model sees: the completion prompt, or the rendered chat (``llmq_core.tokenizer.render_chat``)."""
    if request.messages is not None:
        return render_chat(request.messages)
    return request.prompt or ""


def check_request(request: GenerationRequest, prompt_ids: list[int], context_window: int, vocab_size: int) -> None:
    """Raise :class:`InvalidRequest` unless the request can run on a tokenizing engine: a non-empty prompt, n and
    max_tokens of at least 1, prompt + max_tokens within ``context_window`` tokens, and a valid logit_bias."""
    sampling = request.sampling
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty")
    if sampling.n < 1 or sampling.max_tokens < 1:
        raise InvalidRequest("n and max_tokens must be at least 1")
    if len(prompt_ids) + sampling.max_tokens > context_window:
        raise InvalidRequest(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) exceed the context window of"
            f" {context_window}"
        )
    check_logit_bias(request, vocab_size)


def check_logit_bias(request: GenerationRequest, vocab_size: int) -> None:
    """Raise :class:`InvalidRequest` naming ``logit_bias`` unless every id is in ``[0, vocab_size)`` and every bias in
    [-100, 100] (at most MAX_LOGIT_BIAS_TOKENS entries). Kafka-direct producers skip the API's checks, so engines check."""
    bias = request.sampling.logit_bias or {}
    if len(bias) > MAX_LOGIT_BIAS_TOKENS:
        raise InvalidRequest(f"logit_bias has {len(bias)} tokens; at most {MAX_LOGIT_BIAS_TOKENS} are allowed")
    unknown = sorted(t for t in bias if not 0 <= t < vocab_size)
    if unknown:
        raise InvalidRequest(
            f"logit_bias names token ids outside this model's vocabulary of {vocab_size}: {unknown[:5]}"
        )
    if any(not -100 <= value <= 100 for value in bias.values()):
        raise InvalidRequest("logit_bias values must be between -100 and 100")

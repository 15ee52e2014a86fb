"""The one interface every worker engine implements, and the events it streams.

An engine takes GenerationRequests (:meth:`Engine.submit`), runs them however it batches, and reports progress as events:
:class:`ChunkEvent` (new visible text of one choice, and the token ids it generated since its previous event) and
exactly one :class:`FinalEvent` per submitted request. Every token id a choice generates (and counts in usage) is in
exactly one ChunkEvent before its request's FinalEvent, in order. Times in events are epoch milliseconds from the
engine's clock.

A request with a ``continuation`` (its earlier attempt's worker was lost) resumes each choice from the ids it carries:
the engine primes the choice's text with them (:meth:`llmq_worker.text.ChoiceText.prime`: usage counts them once,
stop strings and UTF-8 characters join across the seam), sends first a ChunkEvent of the text they make (its
``token_ids`` empty: the worker already has them; an API pod re-joins the stream with it) and generates only the rest
of ``max_tokens``. Prompt tokens stay the original prompt's. A continuation of a constrained request (structured
outputs) or of one asking logprobs is ignored (the batcher never sends one: their state does not cross a seam).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmq_core import structured
from llmq_core.clock import Clock
from llmq_core.constants import MAX_LOGIT_BIAS_TOKENS, TOOL
from llmq_core.continuation import resumable
from llmq_core.metrics import GrammarStats
from llmq_core.status import ErrorCode
from llmq_core.tokenizer import render_chat
from llmq_core.wire import Choice, ErrorInfo, FinishReason, GenerationRequest, Outcome, TokenLogprob, Usage
from llmq_worker.prefix_cache import PrefixLedger


class InvalidRequest(ValueError):
    """Raised by :meth:`Engine.submit` when a request can never run (e.g. longer than the context window): ``param``
    and ``code`` of the client's error."""

    def __init__(self, message: str, param: str | None = None, code: str = ErrorCode.INVALID_VALUE) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class ChunkEvent:
    """New visible text of choice ``index`` of ``request_id`` (never part of a UTF-8 character or of a stop string);
    ``logprobs``: the entries released with it (:attr:`llmq_worker.text.ChoiceText.take_logprobs`), None when not asked;
    ``token_ids``: the ids of the choice the engine consumed (and counts) since its previous event for the choice.

    Each generated id is in exactly one event, in order. ``text`` may be "" when an event only reports ids (their text
    is held back: a possible stop string, an incomplete UTF-8 character). A continued choice's first event is the text
    of its continuation's ids, with ``token_ids`` empty (see the module's docstring)."""

    request_id: str
    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    """Where one choice of a request stands: its text, the tokens generated, and how it ended were the request done."""

    index: int
    text: str
    tokens: int
    finish_reason: FinishReason | None
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    logprobs: list[TokenLogprob] | None = None  # of the tokens its text keeps (None: not asked)


class EngineRun(Protocol):
    """What an engine keeps of a request it runs: what its FinalEvent reports (times in epoch ms, 0: not yet)."""

    request: GenerationRequest
    started_ms: int
    first_token_ms: int
    cached_tokens: int  # prompt tokens its engine found in its prefix cache

    @property
    def prompt_tokens(self) -> int: ...

    def choice_ends(self) -> list[ChoiceEnd]: ...


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

    @classmethod
    def build(
        cls,
        run: EngineRun,
        outcome: Outcome,
        finished_ms: int,
        *,
        error: ErrorInfo | None = None,
        shared: bool = False,
        stats: GrammarStats | None = None,
    ) -> FinalEvent:
        """The end of ``run`` with the text so far; choices carry a finish reason only when it succeeded, usage counts
        the prompt once and every choice's tokens; ``shared``: see ``shared_failure``. A succeeded choice of a request
        with tools (tool_choice auto, required or named) that parses as calls carries them instead of its text
        (:func:`llmq_core.structured.may_call_tools`); ``stats`` counts a forced choice that did not parse."""
        ends = run.choice_ends()
        succeeded = outcome is Outcome.SUCCEEDED
        return cls(
            request_id=run.request.request_id,
            outcome=outcome,
            choices=[_choice(run.request, c, succeeded, stats) for c in ends],
            usage=Usage.of(run.prompt_tokens, sum(c.tokens for c in ends), run.cached_tokens),
            started_ms=run.started_ms,
            first_token_ms=run.first_token_ms,
            finished_ms=finished_ms,
            error=error,
            shared_failure=shared,
        )


def _choice(request: GenerationRequest, end: ChoiceEnd, succeeded: bool, stats: GrammarStats | None) -> Choice:
    calls = None
    if succeeded and structured.may_call_tools(request):
        calls = structured.parse_tool_calls(end.text, request.tools, f"call_{request.request_id[-16:]}_{end.index}")
        forced = request.structured is not None and request.structured.kind == TOOL
        if calls is None and forced and end.finish_reason == "stop" and stats is not None:
            stats.tool_call_parse_failures += 1
    return Choice(
        index=end.index,
        text="" if calls else end.text,
        finish_reason=end.finish_reason if succeeded else None,
        stop_sequence=end.stop_sequence if succeeded else None,
        tool_calls=calls,
        logprobs=end.logprobs,
    )


EngineEvent = ChunkEvent | FinalEvent


@dataclass(frozen=True, slots=True)
class Capacity:
    """Slots of an engine: ``free_slots`` = ``max_slots`` - running - queued (floored at 0); ``est_drain_ms`` until idle.
    ``preemptible``: running deferred sequences the engine would preempt now for interactive or near-interactive work
    (:mod:`llmq_worker.preemption`; 0 for an engine that never preempts)."""

    max_slots: int
    running: int
    queued: int
    est_drain_ms: int
    window_end_ms: int = 0  # a fixed-time engine: when its running batch ends (epoch ms; 0: none running)
    preemptible: int = 0

    @property
    def free_slots(self) -> int:
        return max(0, self.max_slots - self.running - self.queued)


class Engine(Protocol):
    """A generation engine. ``submit``/``cancel`` never block; results arrive through :meth:`next_events`."""

    fixed_batch_time_ms: int  # > 0 for a fixed-time batch engine, else 0
    context_window: int  # tokens, prompt + completion
    prefix_ledger: PrefixLedger | None  # what its prefix cache holds, published to the batchers (None: keeps none)

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
    """The event stream engines share: ``put`` from the engine's loop, ``next_events`` drains in batches; ``final``
    ends a request at the engine's ``clock``."""

    def __init__(self, clock: Clock, stats: GrammarStats | None = None) -> None:
        self._clock = clock
        self._stats = stats
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def put(self, event: EngineEvent) -> None:
        self._queue.put_nowait(event)

    def final(
        self, run: EngineRun, outcome: Outcome, *, error: ErrorInfo | None = None, shared_failure: bool = False
    ) -> None:
        """Put the FinalEvent of ``run`` ending now (see :meth:`FinalEvent.build`)."""
        final = FinalEvent.build(
            run, outcome, self._clock.now_ms(), error=error, shared=shared_failure, stats=self._stats
        )
        self.put(final)

    async def next_events(self) -> list[EngineEvent]:
        events = [await self._queue.get()]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events


class TokenRate:
    """Generated tokens/s, smoothed with a half-life (measured over windows of at least ``window_s``), for est_drain_ms.

    Time the engine spent idle (:meth:`idle`: nothing to generate) is no part of a window: the next tokens start a new
    one and the rate stands. Measured across it, the first tokens after 30 s idle read as a fraction of a token per
    second, and est_drain_ms (so the heartbeat's capacity, and the wait API pods predicted from it) grew a hundredfold
    until the half-life smoothed it away."""

    def __init__(
        self, half_life_s: float = 2.0, window_s: float = 0.25, monotonic: Callable[[], float] = time.monotonic
    ):
        self._half_life_s = half_life_s
        self._window_s = window_s
        self._monotonic = monotonic
        self._tokens = 0
        self._mark = (monotonic(), 0)
        self._idle = False
        self.tokens_per_s = 0.0

    def idle(self) -> None:
        """Nothing is left to generate now: the window restarts with the next tokens."""
        self._idle = True

    def add(self, count: int) -> None:
        """``count`` more tokens were generated now."""
        self._tokens += count
        now = self._monotonic()
        if self._idle:
            self._idle, self._mark = False, (now, self._tokens)
            return
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


class SequenceEngine:
    """What the continuous-batching engines (transformers, vllm) share: each request is a job of one sequence per
    choice, kept by request id until its FinalEvent; its sequences' slots and tokens left give the capacity. A subclass
    implements :meth:`_stop` (abort a job's sequences); its jobs also tell ``tokens_left()`` of each live sequence."""

    fixed_batch_time_ms = 0

    def __init__(self, *, max_sequences: int, clock: Clock, prefix_ledger: PrefixLedger | None = None) -> None:
        self._max_sequences = max_sequences
        self.prefix_ledger = prefix_ledger
        self._clock = clock
        self.grammar_stats = GrammarStats()  # structured outputs (llmq_core.metrics reads it)
        self._events = EventQueue(clock, self.grammar_stats)
        self._jobs: dict = {}
        self._rate = TokenRate()

    def cancel(self, request_id: str) -> None:
        """Abort every sequence of ``request_id``; it ends ``canceled`` now with the text so far. Unknown ids: no-op."""
        job = self._jobs.pop(request_id, None)
        if job is not None:
            self._stop(job)
            self._events.final(job, Outcome.CANCELED)

    async def next_events(self) -> list[EngineEvent]:
        return await self._events.next_events()

    def capacity(self) -> Capacity:
        """Slots are sequences (the first ``max_sequences`` live ones run); est_drain_ms from the tokens they have left
        and the recent tokens/s (measured over busy time only)."""
        left = [tokens for job in self._jobs.values() for tokens in job.tokens_left()]
        if not left:  # heartbeats ask while idle: the idle time stays out of the token rate
            self._rate.idle()
        running = min(len(left), self._max_sequences)
        return Capacity(
            max_slots=self._max_sequences,
            running=running,
            queued=len(left) - running,
            est_drain_ms=self._rate.drain_ms(sum(left)),
        )

    def _stop(self, job) -> None:
        raise NotImplementedError


def prompt_text(request: GenerationRequest) -> str:
    """The text the model sees: the completion prompt, or the rendered chat (``llmq_core.tokenizer.render_chat``)."""
    if request.messages is not None:
        return render_chat(request.messages)
    return request.prompt or ""


def continued_ids(request: GenerationRequest) -> list[list[int]] | None:
    """The ids each choice of ``request`` resumes from (one list per choice, at most max_tokens ids; a missing index:
    none), or None when it runs from its start: no continuation, or one the engines ignore (constrained decoding or
    logprobs asked: their state does not cross a seam, and the batcher never continues them)."""
    continuation = request.continuation
    if continuation is None or not resumable(request):
        return None
    ids, most = continuation.token_ids, request.sampling.max_tokens
    return [list(ids[i][:most]) if i < len(ids) else [] for i in range(request.sampling.n)]


def check_request(request: GenerationRequest, prompt_ids: list[int], context_window: int, vocab_size: int) -> None:
    """Raise :class:`InvalidRequest` unless the request can run on a tokenizing engine: a non-empty prompt, n and
    max_tokens of at least 1, prompt + max_tokens within ``context_window`` tokens, and a valid logit_bias."""
    sampling = request.sampling
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty", "messages" if request.messages is not None else "prompt")
    if sampling.n < 1 or sampling.max_tokens < 1:
        param = "n" if sampling.n < 1 else "max_tokens"
        raise InvalidRequest("n and max_tokens must be at least 1", param, ErrorCode.OUT_OF_RANGE)
    if len(prompt_ids) + sampling.max_tokens > context_window:
        raise InvalidRequest(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) exceed the context window of"
            f" {context_window}",
            "max_tokens",
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )
    check_logit_bias(request, vocab_size)


def check_logit_bias(request: GenerationRequest, vocab_size: int) -> None:
    """Raise :class:`InvalidRequest` naming ``logit_bias`` unless every id is in ``[0, vocab_size)`` and every bias in
    [-100, 100] (at most MAX_LOGIT_BIAS_TOKENS entries). Kafka-direct producers skip the API's checks, so engines check."""
    bias = request.sampling.logit_bias or {}
    if len(bias) > MAX_LOGIT_BIAS_TOKENS:
        raise InvalidRequest(
            f"logit_bias has {len(bias)} tokens; at most {MAX_LOGIT_BIAS_TOKENS} are allowed",
            "logit_bias",
            ErrorCode.TOO_MANY_VALUES,
        )
    unknown = sorted(t for t in bias if not 0 <= t < vocab_size)
    if unknown:
        raise InvalidRequest(
            f"logit_bias names token ids outside this model's vocabulary of {vocab_size}: {unknown[:5]}", "logit_bias"
        )
    if any(not -100 <= value <= 100 for value in bias.values()):
        raise InvalidRequest("logit_bias values must be between -100 and 100", "logit_bias", ErrorCode.OUT_OF_RANGE)

"""A fixed-time batch engine: any batch of up to ``max_batch_size`` requests takes ``batch_time_ms`` (seed 003), plus,
with ``prefill_ms_per_token`` > 0, that much per prompt token of the batch not found in its prefix cache (its prefill,
before the first token).

With a prefill term it reports no fixed batch time (``fixed_batch_time_ms`` 0): batchers then dispatch to its free
slots as to a continuous-batching engine, by prefix affinity too, instead of timing its windows. The prefix cache is a
:class:`~llmq_worker.prefix_cache.PrefixLedger` (None: no cache): a request's cached tokens are
its leading prefix blocks found there when its batch starts (a block of PREFIX_BLOCK_BYTES bytes is as many byte
tokens); every request of the batch is recorded there when it starts.

Requests queue; when idle the engine takes up to ``max_batch_size`` of them and runs them for ``batch_time_ms``. Each choice
replays the prompt's own tokens (see :func:`replay_tokens`), spread evenly over the batch time so streams stream; all
requests of a batch finish at its end. Deterministic: every choice of a request is the same replay, so a ``seed`` always
reproduces its answer (it needs no use); ``logit_bias`` is checked against the byte vocabulary but does not change the replay.
Logprobs, when asked, are made up but deterministic (:func:`llmq_worker.logprobs.simulated`).

A continued request (``continuation``, see :mod:`llmq_worker.engine`) resumes each choice of the replay at the number
of ids its continuation holds (those ids are primed, not checked against the replay) and replays only the rest,
spread over the batch it runs in like any other request. A continuation of a constrained request or one asking
logprobs is ignored (it runs from its start).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import MAX_RESULT_BYTES
from llmq_core.status import ErrorType
from llmq_core.tokenizer import VOCAB_SIZE, encode
from llmq_core.wire import ErrorInfo, GenerationRequest, Outcome
from llmq_worker import logprobs
from llmq_worker.engine import (
    Capacity,
    ChoiceEnd,
    ChunkEvent,
    EngineEvent,
    EventQueue,
    check_request,
    continued_ids,
    prompt_text,
)
from llmq_worker.grammars import minimal_answer
from llmq_worker.prefix_cache import PrefixLedger, tokens_per_block
from llmq_worker.text import ChoiceText, ResultBudget

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
MAX_TICKS = 32  # emission steps per batch: enough to stream, few enough to stay cheap


def replay_tokens(request: GenerationRequest) -> list[int]:
    """llmq-sim's completion ids: the prompt's tokens from its start, cycled to ``max_tokens`` (chat: last user message).
    A constrained request (structured outputs) gets a small instance of its schema instead (``grammars.minimal_answer``),
    cut at ``max_tokens``."""
    if request.structured is not None:
        return encode(minimal_answer(request.structured))[: request.sampling.max_tokens]
    if request.messages is not None:
        source = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    else:
        source = request.prompt or ""
    ids = encode(source)
    if not ids:
        return []
    return [ids[i % len(ids)] for i in range(request.sampling.max_tokens)]


@dataclass(slots=True)
class _Run:
    request: GenerationRequest
    tokens: list[int]
    choices: list[ChoiceText]
    prompt_tokens: int
    starts: list[int]  # per choice: where its replay begins here (a continued one: after its continuation's ids)
    chain: tuple[int, ...] = ()
    emitted: list[int] = field(default_factory=list)  # per choice: replay ids emitted so far
    started_ms: int = 0
    first_token_ms: int = 0
    cached_tokens: int = 0

    def choice_ends(self) -> list[ChoiceEnd]:
        # nothing to replay (the choice ends at once, as at an EOS), or a structured answer that closed within max_tokens
        natural_end = not self.tokens or (
            self.request.structured is not None and len(self.tokens) < self.request.sampling.max_tokens
        )
        return [
            ChoiceEnd(i, c.text, c.tokens, c.finish_reason(natural_end), c.stop_sequence, c.logprobs)
            for i, c in enumerate(self.choices)
        ]

    def __post_init__(self) -> None:
        self.emitted = list(self.starts)

    @property
    def rest(self) -> int:
        """The most replay ids a choice of it has left to emit here."""
        return max((len(self.tokens) - start for start in self.starts), default=0)

    def target(self, index: int, tick: int, ticks: int) -> int:
        """Where choice ``index``'s replay stands after ``tick`` of ``ticks``: its rest spread evenly from its start."""
        start = self.starts[index]
        return start + (len(self.tokens) - start) * tick // ticks


class SimulatedEngine:
    """Fixed-time batch engine with an injected clock and sleep (tests drive time by hand)."""

    def __init__(
        self,
        *,
        max_batch_size: int = 64,
        batch_time_ms: int = 500,
        context_window: int = 8192,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
        poison_marker: str | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
        prefill_ms_per_token: float = 0.0,
        prefix_ledger: PrefixLedger | None = None,
    ) -> None:
        """``poison_marker``: fault injection for tests; a batch holding a prompt that contains it fails as a whole.
        ``max_result_bytes``: UTF-8 bytes of all choices' text of one request, where its replay stops (``length``).
        ``prefill_ms_per_token``: ms a batch takes per uncached prompt token beyond ``batch_time_ms``;
        ``prefix_ledger``: the prefix cache (None: none)."""
        # With a prefill term a batch's time varies with its prompts: batchers then treat the engine as they treat a
        # continuous-batching one (dispatch to its free slots, by prefix affinity too) instead of timing its windows.
        self.fixed_batch_time_ms = 0 if prefill_ms_per_token else batch_time_ms
        self._batch_time_ms = batch_time_ms
        self.prefix_ledger = prefix_ledger
        self._prefill_ms_per_token = prefill_ms_per_token
        self._max_result_bytes = max_result_bytes
        self.context_window = context_window
        self._max_batch_size = max_batch_size
        self._clock = clock
        self._sleep = sleep
        self._poison_marker = poison_marker
        self._queue: collections.OrderedDict[str, _Run] = collections.OrderedDict()
        self._running: dict[str, _Run] = {}
        self._batch_end_ms = 0
        self._events = EventQueue(clock)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request``. Raises InvalidRequest unless it passes :func:`~llmq_worker.engine.check_request` with the
        byte vocabulary. A continued request's choices first get their continuation's text (a ChunkEvent each); one
        that none of them has anything left to generate ends at once."""
        prompt_ids = encode(prompt_text(request))
        check_request(request, prompt_ids, self.context_window, VOCAB_SIZE)
        budget = ResultBudget(self._max_result_bytes)
        asked = request.sampling.logprobs is not None
        choices = [ChoiceText(request.sampling.stop, budget=budget, logprobs=asked) for _ in range(request.sampling.n)]
        chain = self.prefix_ledger.chain(request) if self.prefix_ledger is not None else ()
        tokens = replay_tokens(request)
        resumed = continued_ids(request)
        starts = [min(len(ids), len(tokens)) for ids in resumed] if resumed is not None else [0] * len(choices)
        run = _Run(request, tokens, choices, len(prompt_ids), starts, chain)
        if resumed is not None:
            for index, (choice, ids) in enumerate(zip(choices, resumed, strict=True)):
                self._chunk(run, index, choice.prime(ids))  # no ids: the worker has them already
            if all(c.done or start >= len(tokens) for c, start in zip(choices, starts, strict=True)):
                run.started_ms = self._clock.now_ms()
                self._finish(run)
                return
        self._queue[request.request_id] = run
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run_forever())
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        """A queued request ends canceled without starting; a running one stops emitting and ends canceled now."""
        run = self._queue.pop(request_id, None) or self._running.pop(request_id, None)
        if run is not None:
            self._events.final(run, Outcome.CANCELED)

    async def next_events(self) -> list[EngineEvent]:
        return await self._events.next_events()

    def capacity(self) -> Capacity:
        """Running: the current batch; est_drain_ms: rest of it plus one batch time per queued batch."""
        now = self._clock.now_ms()
        rest_ms = max(0, self._batch_end_ms - now) if self._running else 0
        batches = math.ceil(len(self._queue) / self._max_batch_size)
        return Capacity(
            max_slots=self._max_batch_size,
            running=len(self._running),
            queued=len(self._queue),
            est_drain_ms=rest_ms + batches * self._batch_time_ms,
            window_end_ms=self._batch_end_ms if self._running and self.fixed_batch_time_ms else 0,
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                runs = [self._queue.popitem(last=False)[1] for _ in range(min(self._max_batch_size, len(self._queue)))]
                await self._run_batch(runs)

    def _prefill(self, runs: list[_Run]) -> int:
        """Look every run up in the prefix cache, then record them all (a batch's requests prefill together, so none
        finds another's blocks); returns the batch's uncached prompt tokens."""
        ledger = self.prefix_ledger
        if ledger is None:
            return sum(r.prompt_tokens for r in runs)
        weights = [tokens_per_block(r.request, r.prompt_tokens) for r in runs]
        for run, weight in zip(runs, weights, strict=True):
            run.cached_tokens = min(run.prompt_tokens, round(ledger.match(run.chain) * weight))
        for run, weight in zip(runs, weights, strict=True):
            ledger.record(run.chain, weight)
        return sum(r.prompt_tokens - r.cached_tokens for r in runs)

    async def _run_batch(self, runs: list[_Run]) -> None:
        start_ms = self._clock.now_ms()
        prefill_ms = round(self._prefill_ms_per_token * self._prefill(runs))  # before the first token
        self._batch_end_ms = start_ms + prefill_ms + self._batch_time_ms
        for run in runs:
            run.started_ms = start_ms
            self._running[run.request.request_id] = run
        poisoned = self._poison_marker is not None and any(self._poison_marker in prompt_text(r.request) for r in runs)
        ticks = max(1, min(MAX_TICKS, max(r.rest for r in runs)))
        streamed = any(r.request.stream for r in runs)
        for tick in range(1, ticks + 1):
            if not streamed and 1 < tick < ticks:
                continue  # no one receives a non-streamed request's chunks: the first tick times its first token
            await self._sleep_until(start_ms + prefill_ms + self._batch_time_ms * tick // ticks)
            if poisoned:
                self._fail_running()
                return
            for run in list(self._running.values()):
                await self._advance(run, tick, ticks)
        for run in list(self._running.values()):
            self._finish(run)
        self._running.clear()

    async def _advance(self, run: _Run, tick: int, ticks: int) -> None:
        """Emit each choice's ids up to where ``tick`` of ``ticks`` puts it, one choice's slice at a time (n=128
        choices of 8,190 ids each cost about 0.3 CPU s): heartbeats, cancels and results run between slices. A run
        canceled meanwhile emits nothing more."""
        top = run.request.sampling.logprobs
        slices: dict[tuple[int, int], list] = {}  # choices at the same place share one slice (and its entries)
        for index, choice in enumerate(run.choices):
            if run.request.request_id not in self._running:
                return
            begin, end = run.emitted[index], run.target(index, tick, ticks)
            run.emitted[index] = end
            if (begin, end) not in slices:
                new_ids = run.tokens[begin:end]
                entries = None
                if top is not None:
                    raw = logprobs.simulated(new_ids, begin, top)
                    entries = [
                        logprobs.entry(logprobs.byte_token_bytes, i, r) for i, r in zip(new_ids, raw, strict=True)
                    ]
                slices[(begin, end)] = [new_ids, entries]
            new_ids, entries = slices[(begin, end)]
            if new_ids and not run.first_token_ms:
                run.first_token_ms = self._clock.now_ms()
            before = choice.tokens
            text = choice.push(new_ids, entries)
            self._chunk(run, index, text, choice.counted(new_ids, before))
            await asyncio.sleep(0)

    def _finish(self, run: _Run) -> None:
        for index, choice in enumerate(run.choices):
            self._chunk(run, index, choice.finish())
        self._events.final(run, Outcome.SUCCEEDED)

    def _fail_running(self) -> None:
        error = ErrorInfo(type=ErrorType.ENGINE, message="simulated engine failure (poisoned batch)", retryable=False)
        for run in list(self._running.values()):
            self._events.final(run, Outcome.ERRORED, error=error, shared_failure=True)
        log.warning("simulated batch of %d failed", len(self._running))
        self._running.clear()

    def _chunk(self, run: _Run, index: int, text: str, token_ids: tuple[int, ...] = ()) -> None:
        if text or token_ids:
            entries = run.choices[index].take_logprobs()
            self._events.put(ChunkEvent(run.request.request_id, index, text, entries, token_ids))

    async def _sleep_until(self, target_ms: int) -> None:
        delay_ms = target_ms - self._clock.now_ms()
        await self._sleep(max(0, delay_ms) / 1000)

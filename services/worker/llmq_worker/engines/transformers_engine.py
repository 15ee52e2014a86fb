"""Continuous batching on transformers' ``ContinuousBatchingManager`` (iteration-level scheduling, paged KV cache).

The manager runs its own generation thread; its outputs reach the asyncio loop through ``register_result_handler``
(delivered with ``loop.call_soon_threadsafe``). What the manager lacks per request the engine adds: ``n`` choices are
``n`` sub-requests, stop strings are matched on detokenized text and end their sub-request with a cancel, ``max_tokens``
is per sub-request, and every token is chosen by logits processors of the engine's own
(:mod:`llmq_worker.engines.cb_processors`: ``logit_bias``, temperature, top-p, greedy or seeded draws; logprobs by
:mod:`llmq_worker.engines.cb_logprobs`) while the manager itself runs greedy: a seed reproduces its answer exactly for a request run alone and is best effort in a mixed batch. A crashed generation loop fails every request it held as a
shared failure (the worker bisects them) and is replaced by a fresh manager on the next submit.

A continued request (``continuation``, see :mod:`llmq_worker.engine`) runs each choice as prompt + its continuation's
ids, for the rest of ``max_tokens``; its text is primed with those ids. A seeded sampled choice cannot resume its
generator's stream at the seam (its draws restart from the seed), so it reproduces nothing across one; greedy choices
continue exactly. A continuation of a constrained request or one asking logprobs is ignored (it runs from its start).

The engine, not the manager, queues what exceeds its slots: the manager holds at most ``max_concurrent_sequences``
sequences, the rest wait here in :func:`llmq_worker.preemption.admission_order` (people's work first). Interactive or
near-interactive work waiting on full slots preempts running deferred requests (:func:`~llmq_worker.preemption.
choose_victims`): their sequences leave the manager, keep the ids they generated and wait again; admitted later, each
runs as prompt + those ids for the rest of its tokens, its text and usage carried on (no event tells the worker: a
preemption is invisible outside the engine, but for the pause and the metrics).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching import RequestStatus

from llmq_core import tokenizer as byte_tokenizer
from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import DEFERRED, MAX_RESULT_BYTES
from llmq_core.continuation import resumable
from llmq_core.models import LLMQ_TINY
from llmq_core.status import ErrorType
from llmq_core.telemetry import request_fields
from llmq_core.wire import ErrorInfo, GenerationRequest, Outcome
from llmq_worker import logprobs, preemption
from llmq_worker.checkpoints import load_gguf
from llmq_worker.engine import ChoiceEnd, ChunkEvent, InvalidRequest, check_request, continued_ids
from llmq_worker.engines import cb_logprobs, cb_prefix, cb_processors, cb_scheduler
from llmq_worker.engines.cb_queue import QueueingEngine
from llmq_worker.engines.codec import TextCodec
from llmq_worker.engines.tiny_model import build_llmq_tiny
from llmq_worker.grammars import GrammarCache, SequenceGrammar, check_constraint, ll_tokenizer
from llmq_worker.prefix_cache import PrefixLedger, tokens_per_block
from llmq_worker.text import ChoiceText, ResultBudget

log = logging.getLogger(__name__)

CPU_MAX_BATCHED_TOKENS = 1024  # on CPU the library would size its buffers from host RAM: keep them small
# KV pages on CPU: 64 tokens, not the library's 256, since a page is the unit of prefix sharing. Measured on
# smollm2-135m-instruct, code prompts of ~430 tokens sharing a 1.2 KB header: 320 tokens cached instead of 256, first
# token after 0.55 s instead of 0.85 s (1.8 s uncached), decoding no slower.
CPU_PAGE_TOKENS = 64
CPU_KV_CACHE_BYTES = 1 << 30  # upper bound of the paged KV cache on CPU
WARMUP_TIMEOUT_S = 120
# torch threads on CPU: one. Measured on the shared 2-core machine (docs/performance.md): with two, every step's
# threads wait on each other while the rest of the stack takes a core, and continuous batching ran 5-8x slower.
CPU_TORCH_THREADS = 1


@dataclass(slots=True)
class _Sub:
    """One choice of a request, run as one manager request (:func:`_sub_id`) per run: prompt + ``resumed`` (a
    continuation's ids and those of runs before a preemption, already in ``text``), for ``max_tokens`` new tokens (the
    request's less ``resumed``); ``generated``: the ids of the current run."""

    index: int
    text: ChoiceText
    max_tokens: int
    resumed: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    run: int = 0
    done: bool = False
    eos: bool = False

    @property
    def seen(self) -> int:
        return len(self.generated)

    @property
    def over(self) -> bool:
        """Nothing to generate: its continuation reached max_tokens, a stop, the byte cap or an end token."""
        return self.max_tokens <= 0 or self.text.done or self.eos

    @property
    def live(self) -> bool:
        """It still has a sequence to run."""
        return not self.done and not self.over

    def preempt(self) -> None:
        """Its run left the manager: the next run resumes after the ids this one generated."""
        self.resumed += self.generated
        self.max_tokens -= len(self.generated)
        self.generated = []
        self.run += 1


@dataclass(slots=True)
class _Job:
    """A request: its choices, and where it stands in the engine's queue (``admitted``: its sequences are in the
    manager; ``order``: arrival rank; ``preemptions`` so far)."""

    request: GenerationRequest
    prompt_tokens: int
    subs: list[_Sub]
    started_ms: int = 0
    first_token_ms: int = 0
    cached_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    matcher: object = None
    order: int = 0
    admitted: bool = False
    preemptions: int = 0

    def live_subs(self) -> list[_Sub]:
        return [s for s in self.subs if s.live]

    def view(self) -> preemption.JobView:
        request = self.request
        return preemption.JobView(
            request_id=request.request_id,
            traffic_class=request.traffic_class,
            sequences=len(self.live_subs()),
            generated=sum(len(s.resumed) + s.seen for s in self.subs),
            tokens_left=max(self.tokens_left(), default=0),
            deadline_ms=request.deadline_ms,
            preemptions=self.preemptions,
            resumable=resumable(request),
            order=self.order,
        )

    def choice_ends(self) -> list[ChoiceEnd]:
        return [
            ChoiceEnd(
                s.index, s.text.text, s.text.tokens, s.text.finish_reason(s.eos), s.text.stop_sequence, s.text.logprobs
            )
            for s in self.subs
        ]

    def tokens_left(self) -> list[int]:
        return [s.max_tokens - s.seen for s in self.subs if not s.done]


class TransformersEngine(QueueingEngine):
    """The worker's continuous batching engine. Create it inside the running event loop (``from_args`` or directly)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_concurrent_sequences: int = 32,
        max_batched_tokens: int | None = None,
        context_window: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_result_bytes: int = MAX_RESULT_BYTES,
        constrained_decoding: bool = True,
        prefix_ledger: PrefixLedger | None = None,
        max_preemptions: int = 2,
        preemption_min_slack_ms: int = 60_000,
    ) -> None:
        """``max_concurrent_sequences``: sequences per step (and the engine's slots); ``max_batched_tokens``: tokens per
        step (prefill chunks + decodes), None lets the library size it (on GPU). ``context_window`` in tokens;
        ``max_result_bytes``: UTF-8 bytes of all choices' text of one request, where its generation stops;
        ``constrained_decoding``: structured outputs (Settings.worker.constrained_decoding); ``prefix_ledger``: prefix
        caching on (the library's block sharing, scoped and sized as the ledger is; :mod:`cb_prefix`), None: off;
        ``max_preemptions`` (0: never) and ``preemption_min_slack_ms``: :mod:`llmq_worker.preemption`'s limits."""
        super().__init__(max_sequences=max_concurrent_sequences, clock=clock, prefix_ledger=prefix_ledger)
        self._init_queue(max_preemptions, preemption_min_slack_ms)
        if prefix_ledger is not None:
            cb_prefix.install(prefix_ledger.budget_tokens)
        self.context_window = context_window or model.config.max_position_embeddings
        self._max_result_bytes = max_result_bytes
        self._model = model
        self._codec = TextCodec(tokenizer)
        self._perf_to_epoch_ms = time.time() * 1000 - time.perf_counter() * 1000
        self._generation_config = _generation_config(model, tokenizer)
        self._eos_ids = frozenset(self._generation_config.eos_token_id)
        self._constrained = constrained_decoding
        self._cb_config = _cb_config(
            model,
            max_concurrent_sequences,
            max_batched_tokens,
            self.context_window,
            constrained_decoding,
            prefix_ledger,
        )
        vocab_size = model.config.get_text_config().vocab_size
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self._generation_config.eos_token_id[0]
        self._grammars = GrammarCache(
            ll_tokenizer(tokenizer, vocab_size, eos, self._codec.byte_level), self.grammar_stats
        )
        self._manager = None
        self._manager_dead = False
        self._ensure_manager()

    @classmethod
    def from_args(
        cls,
        *,
        model_path: str | None,
        max_concurrent_sequences: int,
        max_batched_tokens: int | None,
        device: str | None = None,
        gguf_file: str | None = None,
        torch_threads: int = 0,
        constrained_decoding: bool = True,
        prefix_ledger: PrefixLedger | None = None,
        max_preemptions: int = 2,
        preemption_min_slack_ms: int = 60_000,
    ) -> TransformersEngine:
        """llmq-tiny (built in code), the HF causal-LM checkpoint at ``model_path``, or the GGUF file ``gguf_file`` in
        it (dequantized to float32), on ``device`` (default: cuda if available). On CPU torch runs ``torch_threads``
        intra-op threads (0: CPU_TORCH_THREADS). Raises OSError when the checkpoint cannot be loaded."""
        model, tokenizer, context_window = _load(model_path, gguf_file, device, torch_threads)
        return cls(
            model,
            tokenizer,
            max_concurrent_sequences=max_concurrent_sequences,
            max_batched_tokens=max_batched_tokens,
            context_window=context_window,
            constrained_decoding=constrained_decoding,
            prefix_ledger=prefix_ledger,
            max_preemptions=max_preemptions,
            preemption_min_slack_ms=preemption_min_slack_ms,
        )

    # --- Engine interface --------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request`` as ``n`` manager requests. Raises InvalidRequest when it cannot fit the context window or
        its logit_bias names ids outside the model's vocabulary. A constrained request whose grammar is not compiled
        yet waits, without sequences, while a thread compiles it (:meth:`_compiled` then queues it)."""
        ids = self._codec.prompt_ids(request)
        check_request(request, ids, self.context_window, self._model.config.get_text_config().vocab_size)
        constraint = request.structured
        if constraint is None:
            self._queue(request, ids, None)
            return
        check_constraint(constraint)
        if not self._constrained:
            raise InvalidRequest(
                "this worker runs without constrained decoding (structured outputs)", "response_format"
            )
        matcher = self._grammars.cached(constraint)
        if matcher is not None:
            self._queue(request, ids, matcher)
            return
        waiting = _Job(request, len(ids), [])
        self._jobs[request.request_id] = waiting
        self._grammars.compiling(constraint).add_done_callback(lambda done: self._compiled(waiting, ids, done))

    def _compiled(self, waiting: _Job, ids: list[int], done: asyncio.Future) -> None:
        request = waiting.request
        error = done.exception()
        if self._jobs.get(request.request_id) is not waiting:
            return  # cancelled (or the engine closed) while compiling
        del self._jobs[request.request_id]
        if error is not None:
            info = ErrorInfo(type=ErrorType.INVALID_REQUEST, message=f"the schema does not compile: {error}")
            self._events.final(waiting, Outcome.ERRORED, error=info)
            return
        self._queue(request, ids, done.result())

    def _queue(self, request: GenerationRequest, ids: list[int], matcher) -> None:
        if self.prefix_ledger is not None:
            self.prefix_ledger.record(self.prefix_ledger.chain(request), tokens_per_block(request, len(ids)))
        job, replays = _new_job(request, len(ids), self._codec, self._max_result_bytes, self._eos_ids)
        job.prompt_ids, job.matcher = ids, matcher
        self._jobs[request.request_id] = job
        self._resume(job, replays)
        if self._jobs.get(request.request_id) is job:  # not ended by its continuation alone
            self._enqueue(job)

    def _resume(self, job: _Job, replays: list[str] | None) -> None:
        """A continued job just added: each choice's first event is its continuation's text; one with nothing left to
        generate ends now."""
        if replays is None:
            return
        for sub, text in zip(job.subs, replays, strict=True):
            self._chunk(job, sub, text)
        if all(sub.over for sub in job.subs):  # nothing runs, so no output will tell when it started
            job.started_ms = job.started_ms or self._clock.now_ms()
        for sub in job.subs:
            if sub.over and not sub.done:
                self._end_sub(job, sub)

    def _add(self, job: _Job) -> bool:
        """Add every live choice of ``job`` to the manager; False (nothing of it left there) when the manager refuses."""
        matcher = job.matcher
        for sub in job.live_subs():
            sub_id = _sub_id(job.request.request_id, sub)
            _tag(job, sub_id, tenant_scoped=self.prefix_ledger is not None and self.prefix_ledger.tenant_scoped)
            self._manager.register_result_handler(
                sub_id, lambda output, job=job, sub=sub, run=sub.run: self._on_output(job, sub, run, output)
            )
            # A seeded choice's generator restarts at a seam (it cannot resume its stream): see the module docstring.
            added = self._manager.add_request(
                job.prompt_ids + sub.resumed,
                request_id=sub_id,
                max_new_tokens=sub.max_tokens,
                streaming=True,
                **_sampling_kwargs(job.request, sub.index),
                **({"grammar": SequenceGrammar(matcher.deep_copy())} if matcher is not None else {}),
            )
            if added is None:
                self._withdraw(job)
                return False
        return True

    async def close(self) -> None:
        """Stop the generation thread (running requests get no further events)."""
        for job in list(self._jobs.values()):
            self._stop(job)
        self._jobs.clear()
        self._waitlist.waiting.clear()
        if self._manager is not None:
            manager, self._manager = self._manager, None
            await asyncio.to_thread(manager.stop, block=True, timeout=30)

    # --- manager outputs (on the event loop thread) ------------------------------------------------------------------

    def _on_output(self, job: _Job, sub: _Sub, run: int, output) -> None:
        if sub.done or sub.run != run or self._jobs.get(job.request.request_id) is not job:
            return  # ended, or the output of a run preempted since
        if output.status == RequestStatus.FAILED:
            # A crashing loop stops accepting before it fails its requests: then none of them will ever finish.
            if self._accepting():
                self._fail(job, output.error or "generation failed")
            else:
                self._retire(output.error or "the generation loop crashed")
            self._schedule()
            return
        self._take_tokens(job, sub, output.generated_tokens, output.logprobs)
        if not job.started_ms and output.lifespan[0] > 0:
            job.started_ms = int(output.lifespan[0] * 1000 + self._perf_to_epoch_ms)
        if sub.text.done:  # a stop string or the result's byte cap: generating more would be wasted
            self._manager.cancel_request(_sub_id(job.request.request_id, sub))
            self._end_sub(job, sub)
        elif output.status == RequestStatus.FINISHED:
            self._end_sub(job, sub)

    def _take_tokens(self, job: _Job, sub: _Sub, generated: list[int], raw_logprobs: list) -> None:
        """``raw_logprobs``: the manager's per generated token (:mod:`cb_logprobs`'s when the request asked)."""
        new_ids = generated[sub.seen :]
        if not new_ids:
            return
        entries = None
        if job.request.sampling.logprobs is not None:
            raws = raw_logprobs[sub.seen : len(generated)]
            raws += [cb_logprobs.UNKNOWN] * (len(new_ids) - len(raws))
            entries = [logprobs.entry(self._codec.token_bytes, t, r) for t, r in zip(new_ids, raws, strict=True)]
        sub.generated += new_ids
        sub.eos = new_ids[-1] in self._eos_ids
        self._rate.add(len(new_ids))
        if not job.first_token_ms:
            job.first_token_ms = self._clock.now_ms()
        before = sub.text.tokens
        text = sub.text.push(new_ids, entries)
        self._chunk(job, sub, text, sub.text.counted(new_ids, before))

    def _end_sub(self, job: _Job, sub: _Sub) -> None:
        sub.done = True
        self._chunk(job, sub, sub.text.finish())
        if all(s.done for s in job.subs):
            del self._jobs[job.request.request_id]
            job.cached_tokens = _forget_prefix(job)
            self._events.final(job, Outcome.SUCCEEDED)
        self._schedule()

    def _retire(self, message: str) -> None:
        """The manager is dying: fail every request it holds (shared failures) and replace it on the next admission;
        waiting requests stay queued for the fresh one."""
        self._manager_dead = True
        scheduling, self._scheduling = self._scheduling, True  # what they free is scheduled by the caller
        try:
            for job in [job for job in self._jobs.values() if job.admitted]:
                self._fail(job, message)
        finally:
            self._scheduling = scheduling

    def _fail(self, job: _Job, message: str) -> None:
        log.warning(
            "generation failed: %s", message, extra=request_fields(job.request.request_id, job.request.traceparent)
        )
        self._jobs.pop(job.request.request_id, None)
        self._stop(job)
        error = ErrorInfo(type=ErrorType.ENGINE, message=message, retryable=True)
        self._events.final(job, Outcome.ERRORED, error=error, shared_failure=True)
        self._schedule()

    def _stop(self, job: _Job) -> None:
        """Abort the job: its unfinished sequences leave the manager (or its queue) for good."""
        job.cached_tokens = _forget_prefix(job)
        self._waitlist.discard(job)
        if job.admitted:
            self._withdraw(job)
        for sub in job.subs:
            sub.done = True

    def _withdraw(self, job: _Job) -> None:
        """Cancel the manager requests of the job's unfinished sequences."""
        if self._manager is None:
            return
        for sub in job.subs:
            if not sub.done:
                sub_id = _sub_id(job.request.request_id, sub)
                self._manager.cancel_request(sub_id)
                # A cancelled request never finishes, so its handler would never be cleaned up (dict.pop is atomic).
                self._manager.output_router.result_handlers.pop(sub_id, None)

    def _forget_prefix(self, job: _Job) -> int:
        return _forget_prefix(job)

    def _chunk(self, job: _Job, sub: _Sub, text: str, token_ids: tuple[int, ...] = ()) -> None:
        if text or token_ids:
            self._events.put(ChunkEvent(job.request.request_id, sub.index, text, sub.text.take_logprobs(), token_ids))

    # --- helpers -----------------------------------------------------------------------------------------------------

    def _ensure_manager(self) -> None:
        """Start a manager, or replace one whose generation loop has died (after a critical error); requests still held
        by the old one fail first (a request added while the loop crashed may never be answered by it)."""
        if self._manager is not None and not self._manager_dead and self._manager.is_running() and self._accepting():
            return
        if self._manager is not None:
            log.error("generation loop died: starting a new one")
            self._retire("the generation loop died")
            self._manager.stop(block=True, timeout=5)
        self._manager = self._model.init_continuous_batching(
            generation_config=self._generation_config, continuous_batching_config=self._cb_config
        )
        cb_processors.install(self._manager, grammars=self._constrained)
        self._manager_dead = False
        self._manager.start()
        # The first steps pay one-off costs (allocations, kernel selection): pay them before a caller waits.
        self._manager.add_request([byte_tokenizer.BYTE_OFFSET] * 8, request_id="__warmup__", max_new_tokens=4)
        self._manager.get_result(request_id="__warmup__", timeout=WARMUP_TIMEOUT_S)

    def _accepting(self) -> bool:
        # A crashing loop fails its requests before its thread exits: in between it is alive but refuses new requests.
        return self._manager.background_thread_status.can_accept_new_requests() is None


def _load(model_path: str | None, gguf_file: str | None, device: str | None, torch_threads: int) -> tuple:
    """(model on its device, tokenizer, context window or None: the model's) of :meth:`TransformersEngine.from_args`."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(torch_threads or CPU_TORCH_THREADS)
    context_window = None
    if model_path is None:
        model, tokenizer = build_llmq_tiny()
        context_window = LLMQ_TINY.context_window
    elif gguf_file is not None:
        model, tokenizer = load_gguf(Path(model_path) / gguf_file)
    else:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model.to(device), tokenizer, context_window


def route_library_logs(level: str = "WARNING") -> None:
    """Send the manager's own logger (which prints plain text to stderr) through the root handlers (JSON lines)."""
    library_logger = logging.getLogger("ContinuousBatchingLogger")
    library_logger.handlers.clear()
    library_logger.propagate = True
    library_logger.setLevel(level)


def _new_job(
    request: GenerationRequest, prompt_tokens: int, codec: TextCodec, max_result_bytes: int, eos_ids
) -> tuple[_Job, list[str] | None]:
    """A fresh job of ``request``, and the text its continuation's ids make per choice (None: not continued)."""
    sampling = request.sampling
    budget = ResultBudget(max_result_bytes)
    resumed = continued_ids(request)
    subs = []
    for i in range(sampling.n):
        ids = resumed[i] if resumed is not None else []
        text = codec.choice(sampling.stop, budget, sampling.logprobs)
        subs.append(_Sub(i, text, sampling.max_tokens - len(ids), ids, eos=bool(ids) and ids[-1] in eos_ids))
    replays = [sub.text.prime(sub.resumed) for sub in subs] if resumed is not None else None
    return _Job(request, prompt_tokens, subs), replays


def _sub_id(request_id: str, sub: _Sub) -> str:
    """The manager's id of the choice's current run: ``<request_id>#<index>``, then ``.<run>`` after a preemption (a
    cancelled run's late outputs must not reach the next)."""
    return f"{request_id}#{sub.index}" if not sub.run else f"{request_id}#{sub.index}.{sub.run}"


def _tag(job: _Job, sub_id: str, tenant_scoped: bool) -> None:
    """Enter the run ``sub_id`` of ``job`` in :mod:`cb_prefix`'s and :mod:`cb_scheduler`'s tables before the manager
    gets it: its tenant's salt (``tenant_scoped``), and whether it is people's work. :func:`_forget_prefix` drops them."""
    if tenant_scoped:
        cb_prefix.SALTS[sub_id] = cb_prefix.salt_of(job.request.tenant_id)
    if job.request.traffic_class != DEFERRED:
        cb_scheduler.PEOPLE.add(sub_id)


def _forget_prefix(job: _Job) -> int:
    """Drop the job's entries in :mod:`cb_prefix`'s and :mod:`cb_scheduler`'s tables; returns the prompt tokens its
    first choice found cached (the prompt is counted once, as usage counts it; a continued choice's own ids are no
    prompt tokens), or what was known before."""
    hits = [cb_prefix.HITS.pop(_sub_id(job.request.request_id, s), None) for s in job.subs]
    for sub in job.subs:
        cb_prefix.SALTS.pop(_sub_id(job.request.request_id, sub), None)
        cb_scheduler.PEOPLE.discard(_sub_id(job.request.request_id, sub))
    return min(hits[0], job.prompt_tokens) if hits and hits[0] is not None else job.cached_tokens


def _sampling_kwargs(request: GenerationRequest, index: int) -> dict:
    """Per-request processor arguments of choice ``index`` (:mod:`cb_processors`): greedy (exact argmax), or
    temperature and top-p drawn from the choice's own generator when seeded; plus the logit_bias pairs."""
    sampling = request.sampling
    if sampling.temperature <= 0:
        kwargs = {"greedy": True}
    else:
        kwargs = {"temperature": float(sampling.temperature), "top_p": float(min(1.0, sampling.top_p))}
        if sampling.seed is not None:
            kwargs["seed_rng"] = cb_processors.seed_rng(sampling.seed, index)
    if sampling.logit_bias:
        kwargs["logit_bias"] = tuple((token, float(bias)) for token, bias in sampling.logit_bias.items())
    if sampling.logprobs is not None:
        kwargs[cb_logprobs.KWARG] = int(sampling.logprobs)
    return kwargs


def _generation_config(model, tokenizer) -> GenerationConfig:
    """Greedy and without processors of the library's own: the engine's (:mod:`cb_processors`) choose every token.
    Generation ends at any of the model's end tokens: its generation config's, its config's and the tokenizer's (a
    chat model's end-of-turn token)."""
    eos_ids = set()
    for eos in (model.generation_config.eos_token_id, model.config.eos_token_id, tokenizer.eos_token_id):
        eos_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return GenerationConfig(
        do_sample=False,
        eos_token_id=sorted(eos_ids) or [-1],
        pad_token_id=model.generation_config.pad_token_id,
    )


def _cb_config(
    model,
    max_sequences: int,
    max_batched_tokens: int | None,
    context_window: int,
    constrained: bool,
    prefix_ledger: PrefixLedger | None,
) -> ContinuousBatchingConfig:
    """The library's knobs. On CPU the paged KV cache is sized for every slot at a quarter context (at least one full
    context) plus the prefix-cache budget, within CPU_KV_CACHE_BYTES: a cache that holds only a few sequences leaves
    the other slots waiting. Block sharing (prefix caching) is on with a ledger."""
    cb_scheduler.install()
    config = ContinuousBatchingConfig(
        max_requests_per_batch=max_sequences,
        max_batch_tokens=max_batched_tokens,
        per_request_processors=True,
        scheduler_type=cb_scheduler.NAME,  # people's prompts in steps of their own
        allow_block_sharing=prefix_ledger is not None,
        # The grammar mask (structured outputs) needs each step's tokens before the next step is prepared, which the
        # library's asynchronous batching (two steps in flight, with CUDA graphs) does not give; None: its choice.
        use_async_batching=False if constrained else None,
    )
    if model.device.type == "cpu":
        config.max_batch_tokens = max_batched_tokens or CPU_MAX_BATCHED_TOKENS
        config.page_size = CPU_PAGE_TOKENS
        budget_tokens = prefix_ledger.budget_tokens if prefix_ledger is not None else 0
        wanted_tokens = max(context_window, max_sequences * context_window // 4) + budget_tokens
        affordable_tokens = CPU_KV_CACHE_BYTES // _kv_bytes_per_token(model)
        config.num_blocks = math.ceil(min(wanted_tokens, affordable_tokens) / config.page_size) + max_sequences
    return config


def _kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token takes across all layers."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize

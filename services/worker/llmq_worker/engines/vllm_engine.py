"""The ``vllm`` engine (optional extra ``llmq[vllm]``, GPU): continuous batching on vLLM's async engine (v1 ``AsyncLLM``).

vLLM is imported only by :meth:`VllmEngine.from_args`, i.e. when ``--engine vllm`` is chosen: this module's top level
needs neither vllm nor torch, so its pure mappings are unit-tested without them. Each choice of a request is one vLLM
request ``<request_id>#<index>`` with n=1 (vLLM refuses n > 1 with greedy sampling; choice i of a seeded request uses
seed + i, as vLLM's own fan-out does), prompted with the token ids of :class:`~llmq_worker.engines.codec.TextCodec` (the
same prompts and counts as the transformers engine) and streamed with cumulative outputs: a ChunkEvent is the part of the
cumulative text not sent yet. vLLM matches stop strings (it never returns them, and holds back a tail that may start one
while streaming), detokenizes incrementally and applies ``logit_bias`` and per-request seeds. A seed reproduces its
answer for a request run alone on the same GPU and vLLM version; in mixed batches it is best effort (other batch shapes
can change the logits' last bits). Logprobs are vLLM's own (``SamplingParams(logprobs=k)``: its default raw logprobs,
before any processing), kept by the rule of :mod:`llmq_worker.text` (a token belongs to the text when its bytes start
before the text's end). Cancelling a request cancels its ``generate`` iterations, which makes vLLM abort them.
If vLLM's engine dies, :meth:`VllmEngine.next_events` raises :class:`EngineDied`: the worker process exits and its
uncommitted batches are redelivered.

A continued request (``continuation``, see :mod:`llmq_worker.engine`) prompts each choice with the prompt's ids plus its
continuation's, for the rest of ``max_tokens`` (:func:`vllm_continued_kwargs`), and takes the text from the generated
ids itself, through a :class:`~llmq_worker.text.ChoiceText` primed with the continuation's ids: vLLM's own stop strings
and detokenizer would not see the text before the seam (a stop string or a character across it). A seeded choice
restarts its generator at the seam (vLLM cannot resume its stream). A continuation of a constrained request or one
asking logprobs is ignored (it runs from its start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import JSON_OBJECT, MAX_RESULT_BYTES
from llmq_core.status import ErrorType
from llmq_core.telemetry import request_fields
from llmq_core.wire import (
    ErrorInfo,
    FinishReason,
    GenerationRequest,
    Outcome,
    SamplingParams,
    Structured,
    TokenLogprob,
)
from llmq_worker import logprobs
from llmq_worker.engine import (
    ChoiceEnd,
    ChunkEvent,
    EngineEvent,
    InvalidRequest,
    SequenceEngine,
    check_request,
    continued_ids,
)
from llmq_worker.prefix_cache import PrefixLedger, tokens_per_block
from llmq_worker.text import REPLACEMENT_CHAR, ChoiceText, ResultBudget

log = logging.getLogger(__name__)

SEED_MODULUS = 1 << 63  # vLLM seeds torch generators: keep every seed a non-negative int64


class EngineDied(RuntimeError):
    """vLLM's engine core died; no request can run on this engine any more."""


# --- pure mappings (tested without vllm) -------------------------------------------------------------------------------


def vllm_sampling_kwargs(sampling: SamplingParams, index: int) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for choice ``index`` of a request (always n=1).

    temperature 0 or top_p 0 is greedy (vLLM wants top_p in (0, 1]); a seed applies to sampled choices only, as
    ``(seed + index) mod 2**63``; logit_bias maps token id -> bias; logprobs (None or the alternatives per token) as
    they are.
    """
    greedy = sampling.temperature <= 0 or sampling.top_p <= 0
    return {
        "n": 1,
        "max_tokens": sampling.max_tokens,
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(min(1.0, sampling.top_p)),
        "stop": list(sampling.stop),
        "seed": None if greedy or sampling.seed is None else (sampling.seed + index) % SEED_MODULUS,
        "logit_bias": {int(t): float(b) for t, b in sampling.logit_bias.items()} if sampling.logit_bias else None,
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
        "logprobs": sampling.logprobs,
    }


def vllm_continued_kwargs(sampling: SamplingParams, index: int, resumed: int) -> dict:
    """:func:`vllm_sampling_kwargs` of choice ``index`` continued after ``resumed`` generated ids: at most the rest of
    max_tokens (at least 1 here: a choice with nothing left is not sent to vLLM), and no stop strings (the engine
    matches them on the text across the seam)."""
    return vllm_sampling_kwargs(sampling, index) | {"max_tokens": sampling.max_tokens - resumed, "stop": []}


def vllm_entries(
    token_ids: list[int], position_logprobs: list[dict], top: int, token_bytes: Callable[[int], bytes]
) -> list[TokenLogprob]:
    """The entries of generated ``token_ids`` from vLLM's ``CompletionOutput.logprobs`` (per token: id -> an object with
    ``logprob``, holding the ``top`` most likely ids and the chosen one)."""
    out = []
    for token_id, candidates in zip(token_ids, position_logprobs, strict=True):
        ranked = sorted(candidates.items(), key=lambda item: -item[1].logprob)[:top]
        raw = (candidates[token_id].logprob, [(i, lp.logprob) for i, lp in ranked])
        out.append(logprobs.entry(token_bytes, token_id, raw))
    return out


def vllm_structured(constraint: Structured | None) -> dict:
    """The keyword arguments of vLLM's own structured outputs (``StructuredOutputsParams``, formerly
    ``GuidedDecodingParams``: the same ``json`` / ``json_object`` fields) for a request's constraint; {} for none.
    A tool constraint is the JSON schema of its call list (``llmq_core.structured.tool_calls_schema``)."""
    if constraint is None:
        return {}
    if constraint.kind == JSON_OBJECT:
        return {"json_object": True}
    return {"json": json.loads(constraint.schema or "{}")}


def structured_params(vllm_module) -> Callable[..., dict]:
    """How this vLLM takes ``vllm_structured``'s arguments in ``SamplingParams``: ``structured_outputs=`` (0.12 and
    later) or ``guided_decoding=`` (before)."""
    params = getattr(vllm_module.sampling_params, "StructuredOutputsParams", None)
    if params is not None:
        return lambda **kwargs: {"structured_outputs": params(**kwargs)} if kwargs else {}
    guided = vllm_module.sampling_params.GuidedDecodingParams
    return lambda **kwargs: {"guided_decoding": guided(**kwargs)} if kwargs else {}


def text_delta(cumulative: str, sent_chars: int) -> str:
    """The new visible text of a choice whose cumulative text is ``cumulative`` and whose first ``sent_chars`` visible
    characters were sent. U+FFFD (bytes of a character not complete yet, or never) is never visible."""
    return cumulative.replace(REPLACEMENT_CHAR, "")[sent_chars:]


def eos_ids(*values) -> frozenset[int]:
    """The end-token ids among ``values`` (each an id, a list of ids, or None: a tokenizer's or config's)."""
    ids = set()
    for value in values:
        ids.update(value if isinstance(value, list | tuple) else [] if value is None else [value])
    return frozenset(int(i) for i in ids)


def finish_reason(vllm_reason: str | None) -> FinishReason | None:
    """vLLM's finish_reason as ours: ``stop`` (EOS, stop string or stop token) and ``length``; None for anything else
    (``abort``, ``error``, or not finished)."""
    return vllm_reason if vllm_reason in ("stop", "length") else None


# --- the engine --------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Choice:
    index: int
    params: object  # vllm.SamplingParams
    text: str = ""
    tokens: int = 0
    reason: str | None = None
    stop_sequence: str | None = None  # vLLM's stop_reason when a stop string ended it (a stop token id is no string)
    done: bool = False
    capped: bool = False  # the result's byte cap ended it (finish_reason length)
    entries: list[TokenLogprob] | None = None  # logprobs asked: one per token so far
    starts: list[int] = field(default_factory=list)  # where each entry's token starts in the text (UTF-8 bytes)
    end_bytes: int = 0  # where the text of the tokens so far ends
    released: int = 0  # entries whose token starts in the text sent
    resumed: list[int] | None = None  # continued: its continuation's ids (prompted after the prompt's); else None
    text_path: ChoiceText | None = None  # continued: the text of its ids (vLLM's text and stops are not used)
    seen: int = 0  # continued: vLLM's generated ids taken so far
    ended: bool = False  # continued: its text ended it (a stop string, the byte cap): vLLM's request is aborted

    @property
    def over(self) -> bool:
        """A continued choice with nothing to generate: max_tokens reached, a stop, the byte cap or an end token."""
        return self.params is None

    def take_logprobs(self, completion, top: int, budget: ResultBudget, codec) -> bool:
        """Add the entries of ``completion``'s new tokens (``top`` alternatives each, bytes from ``codec``); False
        when the result's logprob ``budget`` ran out."""
        known = len(self.entries)
        new_ids = list(completion.token_ids[known:])
        entries = vllm_entries(new_ids, completion.logprobs[known:], top, codec.token_bytes)
        for token_id, entry in zip(new_ids, entries, strict=True):
            if not budget.take_logprob(entry):
                return False
            self.entries.append(entry)
            self.starts.append(self.end_bytes)
            self.end_bytes += codec.text_size(token_id)
        return True

    def push_resumed(self, completion) -> tuple[str, tuple[int, ...]]:
        """A continued choice takes vLLM's cumulative ``completion``: its new ids go through its primed text; returns
        the text released and the ids counted."""
        new_ids = list(completion.token_ids[self.seen :])
        self.seen = len(completion.token_ids)
        before = self.text_path.tokens
        delta = self.text_path.push(new_ids)
        self.text, self.tokens = self.text_path.text, self.text_path.tokens
        return delta, self.text_path.counted(new_ids, before)

    def end_text(self, *, natural_end: bool) -> str:
        """A continued choice's text ends: returns what it still held back; sets its finish reason and stop string."""
        rest = self.text_path.finish()
        self.text = self.text_path.text
        self.reason, self.stop_sequence = self.text_path.finish_reason(natural_end), self.text_path.stop_sequence
        return rest


def _resumed_choice(
    index: int, ids: list[int], text: ChoiceText, sampling: SamplingParams, eos: frozenset[int], make_params: Callable
) -> _Choice:
    """Choice ``index`` continued after ``ids``: ``text`` primed with them (sent first by ``VllmEngine._resume``), and
    no parameters when nothing is left to generate."""
    replay = text.prime(ids)
    over = len(ids) >= sampling.max_tokens or text.done or (bool(ids) and ids[-1] in eos)
    params = None if over else make_params(**vllm_continued_kwargs(sampling, index, len(ids)))
    choice = _Choice(index, params, resumed=ids)
    choice.text_path, choice.text, choice.tokens = text, replay, text.tokens
    return choice


@dataclass(slots=True)
class _Job:
    request: GenerationRequest
    prompt_ids: list[int]
    choices: list[_Choice]
    budget: ResultBudget
    tasks: list[asyncio.Task] = field(default_factory=list)
    started_ms: int = 0
    first_token_ms: int = 0
    cached_tokens: int = 0  # vLLM's num_cached_tokens of the first choice

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def choice_ends(self) -> list[ChoiceEnd]:
        return [
            ChoiceEnd(
                c.index,
                c.text,
                c.tokens,
                finish_reason(c.reason),
                c.stop_sequence,
                None if c.entries is None else c.entries[: c.released],
            )
            for c in self.choices
        ]

    def tokens_left(self) -> list[int]:
        return [self.request.sampling.max_tokens - c.tokens for c in self.choices if not c.done]


class VllmEngine(SequenceEngine):
    """Create it inside the running event loop (``from_args``). ``client``: a vLLM ``AsyncLLM``; ``make_params`` builds
    a ``vllm.SamplingParams`` from :func:`vllm_sampling_kwargs`; ``make_prompt`` a prompt from token ids;
    ``request_errors``: the exceptions that mean a request is invalid (vLLM's validation errors); ``max_result_bytes``:
    UTF-8 bytes of all choices' text of one request, where its generation stops; ``make_prompt`` also takes the
    request's ``cache_salt`` (None: unsalted) when ``prefix_ledger`` scopes the cache to tenants."""

    def __init__(
        self,
        client,
        codec,
        *,
        make_params: Callable[..., object],
        make_prompt: Callable[[list[int]], object],
        max_num_seqs: int,
        context_window: int,
        vocab_size: int,
        request_errors: tuple[type[BaseException], ...] = (ValueError,),
        clock: Clock = SYSTEM_CLOCK,
        max_result_bytes: int = MAX_RESULT_BYTES,
        prefix_ledger: PrefixLedger | None = None,
        eos_ids: frozenset[int] = frozenset(),
    ) -> None:
        """``eos_ids``: the model's end tokens (a continuation ending in one has nothing left to generate)."""
        super().__init__(max_sequences=max_num_seqs, clock=clock, prefix_ledger=prefix_ledger)
        self._eos_ids = eos_ids
        self.context_window = context_window
        self._max_result_bytes = max_result_bytes
        self._client = client
        self._codec = codec
        self._make_params = make_params
        self._make_prompt = make_prompt
        self._vocab_size = vocab_size
        self._request_errors = request_errors
        self._died: BaseException | None = None

    @classmethod
    def from_args(
        cls,
        *,
        model_path: str,
        max_concurrent_sequences: int,
        max_batched_tokens: int | None,
        gpu_memory_utilization: float = 0.9,
        engine_args: dict | None = None,
        prefix_ledger: PrefixLedger | None = None,
    ) -> VllmEngine:
        """vLLM on the HF checkpoint at ``model_path``: ``max_concurrent_sequences`` is vLLM's max_num_seqs (the slots),
        ``max_batched_tokens`` its max_num_batched_tokens (None: vLLM's default); ``engine_args``: more
        ``AsyncEngineArgs`` (e.g. ``dtype``, ``enforce_eager``, ``max_model_len``). Raises ImportError without vllm."""
        import vllm
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind

        from llmq_worker.engines.codec import TextCodec

        try:
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError:  # releases before the v1 engine
            from vllm import AsyncLLMEngine as AsyncLLM
        try:
            from vllm.exceptions import VLLMValidationError
        except ImportError:  # releases that raise plain ValueErrors
            VLLMValidationError = ValueError
        engine_args = AsyncEngineArgs(
            model=model_path,
            max_num_seqs=max_concurrent_sequences,
            max_num_batched_tokens=max_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=prefix_ledger is not None,
            **(engine_args or {}),
        )
        client = AsyncLLM.from_engine_args(engine_args)
        constrained = structured_params(vllm)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        hf_eos = getattr(getattr(client.model_config, "hf_config", None), "eos_token_id", None)
        return cls(
            client,
            TextCodec(tokenizer),
            eos_ids=eos_ids(tokenizer.eos_token_id, hf_eos),
            make_params=lambda structured=None, **kwargs: vllm.SamplingParams(
                **kwargs, **constrained(**(structured or {})), output_kind=RequestOutputKind.CUMULATIVE
            ),
            make_prompt=lambda ids, salt=None: vllm.TokensPrompt(
                prompt_token_ids=ids, **({"cache_salt": salt} if salt else {})
            ),
            max_num_seqs=max_concurrent_sequences,
            context_window=client.model_config.max_model_len,
            prefix_ledger=prefix_ledger,
            vocab_size=client.model_config.get_vocab_size(),
            request_errors=(ValueError, VLLMValidationError),
        )

    # --- Engine interface --------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Start every choice of ``request`` on vLLM. Raises InvalidRequest when it cannot fit the context window, its
        logit_bias names unknown ids, or vLLM refuses its sampling parameters. A continued request's choices first get
        their continuation's text (a ChunkEvent each); one with nothing left to generate ends at once."""
        sampling = request.sampling
        ids = self._codec.prompt_ids(request)
        check_request(request, ids, self.context_window, self._vocab_size)
        budget = ResultBudget(self._max_result_bytes)
        resumed = continued_ids(request)
        try:
            constraint = vllm_structured(request.structured)
            extra = {"structured": constraint} if constraint else {}
            if resumed is None:
                choices = [
                    _Choice(i, self._make_params(**vllm_sampling_kwargs(sampling, i), **extra))
                    for i in range(sampling.n)
                ]
            else:
                choices = [
                    _resumed_choice(
                        i, ids, self._codec.choice(sampling.stop, budget), sampling, self._eos_ids, self._make_params
                    )
                    for i, ids in enumerate(resumed)
                ]
        except self._request_errors as exc:
            raise InvalidRequest(str(exc)) from exc
        for choice in choices:
            choice.entries = None if sampling.logprobs is None else []
        job = _Job(request, ids, choices, budget)
        self._jobs[request.request_id] = job
        if self.prefix_ledger is not None:
            self.prefix_ledger.record(self.prefix_ledger.chain(request), tokens_per_block(request, len(ids)))
        loop = asyncio.get_running_loop()
        job.tasks = [loop.create_task(self._run_choice(job, choice)) for choice in choices if not choice.over]
        if resumed is not None:
            self._resume(job)

    def _resume(self, job: _Job) -> None:
        """Each continued choice's first event: its continuation's text; one with nothing left to generate ends now."""
        for choice in job.choices:
            if choice.text:
                self._events.put(ChunkEvent(job.request.request_id, choice.index, choice.text))
        if all(choice.over for choice in job.choices):  # nothing runs, so no output will tell when it started
            job.started_ms = self._clock.now_ms()
        for choice in job.choices:
            if choice.over:
                ids = choice.resumed
                self._end_text(job, choice, natural_end=bool(ids) and ids[-1] in self._eos_ids)
                self._end_choice(job, choice)

    async def next_events(self) -> list[EngineEvent]:
        """Events in order; raises EngineDied once vLLM's engine is dead."""
        events = await super().next_events()
        if self._died is not None:
            raise EngineDied(f"vLLM's engine died: {self._died!r}") from self._died
        return events

    async def close(self) -> None:
        """Abort everything and shut vLLM down (running requests get no further events)."""
        tasks = [task for job in self._jobs.values() for task in job.tasks]
        self._jobs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._client.shutdown()

    # --- one choice ----------------------------------------------------------------------------------------------------

    async def _run_choice(self, job: _Job, choice: _Choice) -> None:
        sub_id = f"{job.request.request_id}#{choice.index}"
        outputs = self._client.generate(self._prompt(job, choice), choice.params, sub_id)
        try:
            async with contextlib.aclosing(outputs):  # leaving early (the byte cap) closes it: vLLM aborts the request
                async for output in outputs:
                    if choice.index == 0:
                        job.cached_tokens = getattr(output, "num_cached_tokens", None) or 0
                    if choice.text_path is not None:
                        self._take_resumed(job, choice, output.outputs[0])
                    else:
                        self._take(job, choice, output.outputs[0])
                    if choice.capped or choice.ended:
                        break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes this request's FinalEvent
            self._failed(job, exc)
            return
        self._end_choice(job, choice)

    def _prompt(self, job: _Job, choice: _Choice):
        """The vLLM prompt of ``choice``: its job's token ids (and a continued choice's own after them), salted by
        tenant when the prefix cache is tenant-scoped."""
        ids = job.prompt_ids + choice.resumed if choice.resumed is not None else job.prompt_ids
        ledger = self.prefix_ledger
        if ledger is None or not ledger.tenant_scoped:
            return self._make_prompt(ids)
        return self._make_prompt(ids, job.request.tenant_id)

    def _take(self, job: _Job, choice: _Choice, completion) -> None:
        if self._jobs.get(job.request.request_id) is not job:
            return
        now = self._clock.now_ms()
        job.started_ms = job.started_ms or now  # vLLM reports nothing earlier in a stable form: its first output
        new_ids = tuple(completion.token_ids[choice.tokens :])
        if new_ids:
            self._rate.add(len(new_ids))
            choice.tokens = len(completion.token_ids)
            job.first_token_ms = job.first_token_ms or now
        choice.reason = completion.finish_reason
        choice.stop_sequence = completion.stop_reason if isinstance(completion.stop_reason, str) else None
        if choice.entries is not None and not choice.take_logprobs(
            completion, job.request.sampling.logprobs, job.budget, self._codec
        ):
            choice.capped, choice.reason, choice.stop_sequence = True, "length", None
        delta = job.budget.take(text_delta(completion.text, len(choice.text))) if not job.budget.exhausted else ""
        if job.budget.exhausted:
            choice.capped, choice.reason, choice.stop_sequence = True, "length", None
        if delta or new_ids:
            choice.text += delta
            released = choice.released
            if choice.entries is not None:
                sent = len(choice.text.encode())
                while choice.released < len(choice.starts) and choice.starts[choice.released] < sent:
                    choice.released += 1
            entries = None if choice.entries is None else choice.entries[released : choice.released]
            self._events.put(ChunkEvent(job.request.request_id, choice.index, delta, entries, new_ids))

    def _take_resumed(self, job: _Job, choice: _Choice, completion) -> None:
        """A continued choice's output (:meth:`_Choice.push_resumed`); vLLM's finish (EOS, max_tokens) or the text's
        own end (a stop string, the byte cap) ends it."""
        if self._jobs.get(job.request.request_id) is not job:
            return
        now = self._clock.now_ms()
        job.started_ms = job.started_ms or now
        seen = choice.seen
        delta, counted = choice.push_resumed(completion)
        if choice.seen > seen:
            self._rate.add(choice.seen - seen)
            job.first_token_ms = job.first_token_ms or now
        if delta or counted:
            self._events.put(ChunkEvent(job.request.request_id, choice.index, delta, None, counted))
        if choice.text_path.done or finish_reason(completion.finish_reason) is not None:
            choice.ended = choice.text_path.done
            self._end_text(job, choice, natural_end=completion.finish_reason == "stop")
        else:
            choice.reason = completion.finish_reason  # None while running; abort or error fail the request

    def _end_text(self, job: _Job, choice: _Choice, *, natural_end: bool) -> None:
        if rest := choice.end_text(natural_end=natural_end):
            self._events.put(ChunkEvent(job.request.request_id, choice.index, rest))

    def _end_choice(self, job: _Job, choice: _Choice) -> None:
        if self._jobs.get(job.request.request_id) is not job:
            return
        choice.done = True
        if finish_reason(choice.reason) is None:
            self._fail(job, f"vLLM ended choice {choice.index} with finish_reason {choice.reason!r}", retryable=True)
        elif all(c.done for c in job.choices):
            del self._jobs[job.request.request_id]
            self._events.final(job, Outcome.SUCCEEDED)

    def _failed(self, job: _Job, exc: Exception) -> None:
        if getattr(self._client, "errored", False):
            self._died = exc
            self._fail(job, f"vLLM's engine died: {exc!r}", retryable=True)
        elif isinstance(exc, self._request_errors):
            self._fail(job, str(exc), error_type=ErrorType.INVALID_REQUEST, shared=False)
        else:
            self._fail(job, f"vLLM failed: {exc!r}", retryable=True)

    def _fail(
        self,
        job: _Job,
        message: str,
        *,
        error_type: str = ErrorType.ENGINE,
        retryable: bool = False,
        shared: bool = True,
    ) -> None:
        """End ``job`` errored; ``shared``: the failure may not be its own (the worker bisects and re-runs)."""
        if self._jobs.pop(job.request.request_id, None) is not job:
            return
        log.warning(
            "generation failed: %s", message, extra=request_fields(job.request.request_id, job.request.traceparent)
        )
        self._stop(job)
        error = ErrorInfo(type=error_type, message=message, retryable=retryable)
        self._events.final(job, Outcome.ERRORED, error=error, shared_failure=shared)

    def _stop(self, job: _Job) -> None:
        """Cancel the job's generate iterations (vLLM aborts their requests), all but the one running this."""
        current = asyncio.current_task()
        for task in job.tasks:
            if task is not current:
                task.cancel()
        for choice in job.choices:
            choice.done = True

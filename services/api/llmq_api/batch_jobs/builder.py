"""Building a batch job from its requests, whichever API they came through (``/v1/batches``' input file, a
``/v1/messages/batches`` body): each checked line goes to the job's prepared file and ledger as it streams in (written
ahead of the job, a slice per chunk), then the job is refused (structural errors, its estimate over the batch quota,
its possible results over the result-byte bounds) or started ``in_progress`` for the result-routers to drive. The
pod holds one chunk at a time, never the whole input; it never produces lines itself (see
:mod:`llmq_result_router.jobs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

import msgspec

from llmq_api import validation
from llmq_api.admission import too_many_requests
from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs
from llmq_api.errors import ApiError, invalid
from llmq_api.ratelimit import RateLimiter, check_batch_fits, effective_max_tokens, token_cost
from llmq_core import wire
from llmq_core.clock import Clock
from llmq_core.constants import CONTENT_TYPE_JSON, DEFERRED, MAX_LOGPROBS_BYTES, MAX_RESULT_BYTES
from llmq_core.settings import Settings
from llmq_core.status import ErrorType
from llmq_core.token_counts import TokenCounter
from llmq_jobs import jobs
from llmq_jobs.filestore import FileStore
from llmq_jobs.jobs import JobOwner, JobSpec, JobView
from llmq_jobs.store import JobStore

CREATE_RETRY_AFTER_S = 2  # a busy pod's or tenant's creates: each takes about a second per 10 MB of input
# Budgeting a line's ledger bytes: UTF-8 bytes per generated token (tokenizers average about 4 for English text; the
# simulated engine makes 1) and a stored result's envelope beyond its text (ids, usage, timings, per-choice fields).
RESULT_BYTES_PER_TOKEN = 4
RESULT_ENVELOPE_BYTES = 512
# A line that asks for logprobs: each token's entry, and each alternative in it (JSON, measured on word tokens: about
# 93 and 77 bytes; msgpack, as stored, about 60% of that), at most MAX_LOGPROBS_BYTES in all.
LOGPROB_BYTES_PER_TOKEN, LOGPROB_BYTES_PER_ALTERNATIVE = 100, 80


@dataclass
class _Tally:
    """What validating an input file counts as it streams: lines, the runnable ones' token estimate, prepared bytes."""

    total: int = 0
    runnable: int = 0
    errored: int = 0
    estimate: int = 0
    position: int = 0
    result_bytes: int = 0  # the most the job's ledger may hold: each line's largest result (see line_result_bytes)


class InvalidInput(Exception):
    """The input has structural errors (``checked.errors``): an OpenAI batch is created ``failed`` with them, a
    Message Batch refused 400."""

    def __init__(self, checked: inputs.CheckedInput) -> None:
        self.checked = checked


class CreateSlots:
    """The pod's and each tenant's concurrent creates, bounded by ``batch_create_max_per_pod`` and ``_per_tenant``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._creating: list[str] = []  # tenant of each create running on this pod

    @contextlib.contextmanager
    def hold(self, tenant_id: str) -> Iterator[None]:
        """One of the pod's and the tenant's concurrent creates; 429 with Retry-After when none is free."""
        settings = self.settings
        if (
            len(self._creating) >= settings.jobs.batch_create_max_per_pod
            or self._creating.count(tenant_id) >= settings.jobs.batch_create_max_per_tenant
        ):
            raise too_many_requests(
                f"Too many batches are being created at once (at most "
                f"{settings.jobs.batch_create_max_per_tenant} per tenant and "
                f"{settings.jobs.batch_create_max_per_pod} per API pod); retry shortly",
                CREATE_RETRY_AFTER_S,
            )
        self._creating.append(tenant_id)
        try:
            yield
        finally:
            self._creating.remove(tenant_id)


class JobBuilder:
    """Creates the jobs of one API pod. ``models()`` gives the served models (name -> context window); ``limiter``
    the tenants' buckets (a job takes its lines' estimate from the batch quota); ``counters`` each model's
    tokenizer (others count bytes), as over HTTP."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        files: FileStore,
        clock: Clock,
        models: Callable[[], Mapping[str, int]],
        limiter: RateLimiter,
        counters: Mapping[str, TokenCounter] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.files = files
        self.clock = clock
        self.models = models
        self.limiter = limiter
        self.counters = counters or {}
        self._slots = CreateSlots(settings)

    def new_spec(self, batch_id: str, principal: Principal, endpoint: str, window_s: int, **fields) -> JobSpec:
        """A job's spec before its input is read (``total`` and ``runnable`` are counted while it is), expiring
        ``window_s`` after now; ``fields``: the rest of the spec (input_file_id, completion_window, ...)."""
        now_ms = self.clock.now_ms()
        return JobSpec(
            id=batch_id,
            tenant_id=principal.tenant_id,
            endpoint=endpoint,
            created_ms=now_ms,
            expires_ms=now_ms + window_s * 1000,
            prepared_path=f"jobs/{batch_id}/requests.jsonl",
            results_path=f"jobs/{batch_id}/results.jsonl",
            **fields,
        )

    def checker(self, endpoint: str, max_lines: int) -> inputs.InputChecker:
        """A checker of ``endpoint``'s requests, at most ``max_lines`` of them, each within the line bound."""
        jobs_settings = self.settings.jobs
        api = self.settings.api
        limits = inputs.Limits(
            max_lines, jobs_settings.batch_max_line_bytes, api.max_stop_bytes, self.counters, api.max_json_schema_bytes
        )
        return inputs.InputChecker(endpoint, self.models(), limits)

    async def build(
        self,
        spec: JobSpec,
        principal: Principal,
        staged: AsyncIterator[list[inputs.InputLine]],
        checked: inputs.CheckedInput,
    ) -> JobView:
        """Stage every line ``staged`` yields (its checker gathering errors in ``checked``), then start the job.
        Raises InvalidInput (``checked`` has structural errors), ApiError (400 an estimate over the batch quota or
        results over the job's bound, 429 the quota's rest today, the tenant's result bytes, concurrent creates);
        whatever was written ahead is dropped first."""
        with self._slots.hold(principal.tenant_id):
            try:
                tally = await self._stage_all(spec, principal, staged)
                if checked.errors:
                    raise InvalidInput(checked)
                return await self._start_within_quotas(spec, principal, tally)
            except BaseException:
                await self.store.ledger.discard_ledger(spec.id)
                await self.files.delete(spec.prepared_path)
                raise

    async def _stage_all(
        self, spec: JobSpec, principal: Principal, staged: AsyncIterator[list[inputs.InputLine]]
    ) -> _Tally:
        tally = _Tally()
        async with self.files.writer(spec.prepared_path) as write:
            async with contextlib.aclosing(staged) as batches:
                async for lines in batches:
                    await self._stage(spec, principal, lines, write, tally)
        return tally

    async def _start_within_quotas(self, spec: JobSpec, principal: Principal, tally: _Tally) -> JobView:
        """Start the job if its estimate fits the batch quota and its possible results the result-byte bounds."""
        check_batch_fits(tally.estimate, principal)
        spec = msgspec.structs.replace(
            spec, total=tally.total, runnable=tally.runnable, result_bytes=tally.result_bytes
        )
        await self._reserve_result_bytes(spec)
        try:
            rejection = await self.limiter.acquire_batch(principal, tally.estimate)
            if rejection is not None:
                raise rejection.error
            try:
                return await self._start(spec, tally.errored)
            except BaseException:
                await self.limiter.refund_batch(principal, tally.estimate)
                raise
        except BaseException:
            await self.store.quotas.unreserve_result_bytes(spec.tenant_id, spec.result_bytes)
            raise

    async def _reserve_result_bytes(self, spec: JobSpec) -> None:
        """Bound what the job's ledger may hold in Redis (never evicted while it runs): 400 past the job's bound or
        one the tenant's could never fit, 429 while the tenant's running jobs hold too much of theirs."""
        settings = self.settings
        bound = min(settings.jobs.batch_job_max_result_bytes, settings.jobs.batch_tenant_max_result_bytes)
        if spec.result_bytes > bound:
            raise invalid(
                f"This batch's results could take {spec.result_bytes} bytes (each line's largest result: "
                f"{RESULT_BYTES_PER_TOKEN} bytes per token of n x max_tokens, at most {MAX_RESULT_BYTES}, "
                f"plus logprobs when asked, plus {RESULT_ENVELOPE_BYTES}); the limit is {bound} bytes per batch. Split the file or "
                "lower max_tokens/n",
                param="input_file_id",
                code="batch_results_too_large",
            )
        limit = settings.jobs.batch_tenant_max_result_bytes
        if await self.store.quotas.reserve_result_bytes(spec.tenant_id, spec.result_bytes, limit) is None:
            raise ApiError(
                429,
                f"This tenant's running batches could take up to {limit} bytes of results, and this "
                f"one's {spec.result_bytes} do not fit beside them; create it once some of them have "
                "ended",
                param="input_file_id",
                code="batch_results_quota_exceeded",
                retryable=False,
            )

    async def _stage(
        self,
        spec: JobSpec,
        principal: Principal,
        lines: list[inputs.InputLine],
        write: Callable[[bytes], Awaitable[int]],
        tally: _Tally,
    ) -> None:
        """Write one chunk's lines: the valid ones' requests to the prepared file, every line to the ledger."""
        prepared, states, offsets, results, requests = [], {}, {}, {}, {}
        windows = self.models()
        for line in lines:
            tally.total += 1
            if line.error is not None:
                tally.errored += 1
                states[line.custom_id] = jobs.ERRORED
                results[line.custom_id] = _rejected(spec, principal, line)
                tally.result_bytes += len(wire.encode(results[line.custom_id]))
                continue
            encoded = wire.encode(_request(spec, principal, line), CONTENT_TYPE_JSON) + b"\n"
            prepared.append(encoded)
            requests[line.custom_id] = encoded.rstrip(b"\n")
            offsets[line.custom_id] = f"{tally.position}:{tally.position + len(encoded)}"
            tally.position += len(encoded)
            tally.runnable += 1
            window = windows.get(line.valid.model, 0)
            tally.estimate += token_cost(line.valid, window)
            tally.result_bytes += line_result_bytes(line.valid, window)
            states[line.custom_id] = jobs.pending(0)
        if prepared:
            await write(b"".join(prepared))
        if states:
            await self.store.ledger.add_lines(spec.id, states, offsets, results, requests)

    async def fail(self, spec: JobSpec, checked: inputs.CheckedInput) -> JobView:
        """Create the job ``failed`` with ``checked``'s structural errors (an OpenAI batch's ``errors``)."""
        now_s = spec.created_ms // 1000
        await self.store.jobs.create_job(
            spec,
            jobs.FAILED,
            {jobs.VALIDATING: now_s, jobs.FAILED: now_s},
            files=(),
            errors=checked.reported_errors(),
            owner=self._claim(spec),
        )
        return await self.read(spec.id)

    async def _start(self, spec: JobSpec, errored: int) -> JobView:
        now_s = self.clock.now_ms() // 1000
        expires_at = jobs.output_files_expire_at(spec, self.settings.jobs.files_retention_s)
        await self.store.jobs.create_job(
            spec,
            jobs.IN_PROGRESS,
            {jobs.VALIDATING: spec.created_ms // 1000, jobs.IN_PROGRESS: now_s},
            files=jobs.output_files(spec, now_s, expires_at),
            errored=errored,
            owner=self._claim(spec),
        )
        return await self.read(spec.id)

    def _claim(self, spec: JobSpec) -> JobOwner:
        """This region's claim on a job it creates (epoch 0): the job log's owner record and the fencing view."""
        return JobOwner(batch_id=spec.id, region=self.settings.region.name, at_ms=self.clock.now_ms())

    async def read(self, batch_id: str) -> JobView:
        job = await self.store.jobs.get_job(batch_id)
        if job is None:  # written a moment ago: only a Redis flush gets here
            raise ApiError(500, f"Batch {batch_id} vanished after it was created", type=ErrorType.SERVER)
        return job


def line_result_bytes(valid: validation.ValidRequest, context_window: int) -> int:
    """The most a line's stored result may take: its text budgeted at RESULT_BYTES_PER_TOKEN per token it may
    generate (n x effective max_tokens), at most the workers' MAX_RESULT_BYTES, its logprob entries when it asks
    (LOGPROB_BYTES_PER_TOKEN and LOGPROB_BYTES_PER_ALTERNATIVE, at most MAX_LOGPROBS_BYTES), plus the envelope."""
    tokens = valid.sampling.n * effective_max_tokens(valid, context_window)
    alternatives = valid.sampling.logprobs
    logprobs = 0
    if alternatives is not None:
        per_token = LOGPROB_BYTES_PER_TOKEN + alternatives * LOGPROB_BYTES_PER_ALTERNATIVE
        logprobs = min(MAX_LOGPROBS_BYTES, tokens * per_token)
    return min(MAX_RESULT_BYTES, tokens * RESULT_BYTES_PER_TOKEN) + logprobs + RESULT_ENVELOPE_BYTES


def _request(spec: JobSpec, principal: Principal, line: inputs.InputLine) -> wire.GenerationRequest:
    """Round 0 of a line as the result-router will produce it (``created_ms`` is stamped then)."""
    return line.valid.to_wire(
        principal,
        DEFERRED,
        request_id=jobs.line_request_id(spec.id, line.custom_id),
        created_ms=spec.created_ms,
        deadline_ms=spec.expires_ms,
        reply_to=wire.JobReply(batch_id=spec.id, custom_id=line.custom_id),
    )


def _rejected(spec: JobSpec, principal: Principal, line: inputs.InputLine) -> wire.FinalResult:
    """The errored result of a line whose body failed validation: it never runs."""
    error = line.error
    return jobs.unrun_line_result(
        spec.id,
        line.custom_id,
        wire.Outcome.ERRORED,
        wire.ErrorInfo(type=error.type, message=error.message, code=error.code, param=error.param),
        finished_ms=spec.created_ms,
        model=line.model,
        tenant_id=principal.tenant_id,
        endpoint=jobs.wire_endpoint(spec.endpoint),
        api_format=spec.api_format,
        created_ms=spec.created_ms,
    )

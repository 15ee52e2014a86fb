"""The API pod's side of ``/v1/batches``: validate and create jobs from uploaded files, read them back, ask for a
cancel. Every object belongs to the tenant that created it; any other tenant gets the same 404 as for a missing one.

Creating a job is synchronous: the input file is streamed from the store and validated line by line (in a thread)
while the request waits, never held whole, so a batch is returned ``in_progress`` (its lines are in the ledger and
the result-routers drive it) or ``failed`` (with the structural errors). The API pod never produces lines itself: see
:mod:`llmq_result_router.jobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

import msgspec

from llmq_api import validation
from llmq_api.admission import too_many_requests
from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs
from llmq_api.batch_jobs.access import check_deferred, not_found, owned_file, take_request
from llmq_api.batch_jobs.expiry import OUTPUT_PARAM, ExpiresAfter, policy_seconds
from llmq_api.errors import ApiError, invalid
from llmq_api.ratelimit import RateLimiter, check_batch_fits, effective_max_tokens, token_cost
from llmq_core import ids, wire
from llmq_core.clock import Clock
from llmq_core.constants import CONTENT_TYPE_JSON, DEFERRED, HTTP_IDEMPOTENCY_KEY, MAX_RESULT_BYTES
from llmq_core.requests import echo
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
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class CreateBatch(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/batches`` (other OpenAI fields are accepted and ignored)."""

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


@dataclass
class _Tally:
    """What validating an input file counts as it streams: lines, the runnable ones' token estimate, prepared bytes."""

    total: int = 0
    runnable: int = 0
    errored: int = 0
    estimate: int = 0
    position: int = 0
    result_bytes: int = 0  # the most the job's ledger may hold: each line's largest result (see line_result_bytes)


class _Failed(Exception):
    """The input file has structural errors: the job is created ``failed`` with them."""

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


class BatchJobs:
    """Batch jobs of one API pod. ``models()`` gives the served models (name -> context window); ``limiter`` the
    tenants' buckets (every POST takes a request; a batch its lines' estimate from the batch quota)."""

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
        self.counters = counters or {}  # model -> its tokenizer (others count bytes), as over HTTP
        self.store = store
        self.files = files
        self.clock = clock
        self.models = models
        self.limiter = limiter
        self._slots = CreateSlots(settings)

    async def create(self, principal: Principal, body: bytes, idempotency_key: str | None = None) -> JobView:
        """Validate and create a job from a ``POST /v1/batches`` body. A repeated ``idempotency_key`` returns the
        batch it created (nothing runs twice); the same key with another input file, endpoint, window, metadata or
        output expiry is refused 422. Raises 400 (bad body, endpoint, window, metadata, output_expires_after, input file
        purpose, an estimate over the batch quota, possible results over the job's or the tenant's result bytes), 403
        (the key may not use the deferred class), 404 (input file), 409 (the same key's batch is being created), 429
        (requests per minute, the batch quota's rest today, the tenant's running jobs' result bytes, concurrent
        creates)."""
        check_deferred(principal, "create batches")
        await take_request(self.limiter, principal)
        request = validation.decode_body(body, CreateBatch)
        batch_id = ids.batch_job_id(self.settings.region.name)
        if idempotency_key is None:
            return await self._create(principal, request, batch_id)
        earlier = await self.store.jobs.claim_batch_key(
            principal.tenant_id, idempotency_key, batch_id, self.settings.jobs.files_retention_s
        )
        if earlier is not None:
            job = await self.store.jobs.get_job(earlier)
            if job is None:
                raise ApiError(
                    409,
                    "A batch with this Idempotency-Key is being created; retry shortly",
                    code="idempotency_key_in_use",
                    retryable=True,
                )
            if not _repeats(request, job.spec):
                raise ApiError(
                    422,
                    f"This Idempotency-Key already created batch {job.spec.id} with a different "
                    "input_file_id, endpoint, completion_window, metadata or output_expires_after",
                    param=HTTP_IDEMPOTENCY_KEY,
                    code="idempotency_key_reused",
                )
            return job
        try:
            return await self._create(principal, request, batch_id)
        except BaseException:
            await self.store.jobs.release_batch_key(principal.tenant_id, idempotency_key)
            raise

    async def _create(self, principal: Principal, request: CreateBatch, batch_id: str) -> JobView:
        endpoint = request.endpoint
        if endpoint not in jobs.BATCH_ENDPOINTS:
            raise invalid(
                f"endpoint must be one of {', '.join(jobs.BATCH_ENDPOINTS)}, got {echo(endpoint)}",
                param="endpoint",
                code="invalid_endpoint",
            )
        try:
            window_s = jobs.parse_window(request.completion_window, self.settings.jobs.batch_max_window_s)
        except ValueError as exc:
            raise invalid(str(exc), param="completion_window", code="invalid_completion_window") from None
        _check_metadata(request.metadata)
        expires_after_s = policy_seconds(request.output_expires_after, OUTPUT_PARAM)
        source = await owned_file(self.store.files, principal, request.input_file_id)
        if source.purpose != jobs.FILE_PURPOSE_BATCH or source.kind != "input":
            raise invalid(f"File {source.id} does not have purpose 'batch'", param="input_file_id")
        spec = self._spec(batch_id, principal, request, window_s, expires_after_s)
        with self._slots.hold(principal.tenant_id):
            try:
                return await self._validate(spec, principal, source.path)
            except _Failed as failed:
                await self._discard(spec)
                return await self._fail(spec, failed.checked)
            except BaseException:
                await self._discard(spec)
                raise

    async def _discard(self, spec: JobSpec) -> None:
        """Drop what validating a job that is not created wrote ahead: its ledger slices and prepared file."""
        await self.store.ledger.discard_ledger(spec.id)
        await self.files.delete(spec.prepared_path)

    def _spec(
        self, batch_id: str, principal: Principal, request: CreateBatch, window_s: int, expires_after_s: int | None
    ) -> JobSpec:
        """The job's spec before its input is read (``total`` and ``runnable`` are counted while it is)."""
        now_ms = self.clock.now_ms()
        return JobSpec(
            id=batch_id,
            tenant_id=principal.tenant_id,
            endpoint=request.endpoint,
            input_file_id=request.input_file_id,
            completion_window=request.completion_window,
            created_ms=now_ms,
            expires_ms=now_ms + window_s * 1000,
            metadata=request.metadata,
            output_file_id=ids.file_id(self.settings.region.name),
            error_file_id=ids.file_id(self.settings.region.name),
            prepared_path=f"jobs/{batch_id}/requests.jsonl",
            results_path=f"jobs/{batch_id}/results.jsonl",
            output_expires_after_s=expires_after_s,
        )

    async def _validate(self, spec: JobSpec, principal: Principal, source_path: str) -> JobView:
        """Stream the input file from the store line by line: each valid line goes to the prepared file and the
        job's ledger (written ahead of the job, a slice per chunk read), so the pod holds one chunk at a time.
        Then fail the job (structural errors), refuse it (its estimate does not fit the batch quota), or start it."""
        limits = inputs.Limits(
            self.settings.jobs.batch_max_lines,
            self.settings.jobs.batch_max_line_bytes,
            self.settings.api.max_stop_bytes,
            self.counters,
        )
        checker = inputs.InputChecker(spec.endpoint, self.models(), limits)
        tally = _Tally()
        async with self.files.writer(spec.prepared_path) as write:
            async with contextlib.aclosing(self.files.iter_bytes(source_path)) as chunks:
                async for chunk in chunks:
                    await self._stage(spec, principal, await asyncio.to_thread(checker.feed, chunk), write, tally)
                    if checker.stopped:
                        break
            await self._stage(spec, principal, checker.end(), write, tally)
        if checker.checked.errors:
            raise _Failed(checker.checked)
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
                f"plus {RESULT_ENVELOPE_BYTES}); the limit is {bound} bytes per batch. Split the file or "
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

    async def _fail(self, spec: JobSpec, checked: inputs.CheckedInput) -> JobView:
        now_s = spec.created_ms // 1000
        await self.store.jobs.create_job(
            spec,
            jobs.FAILED,
            {jobs.VALIDATING: now_s, jobs.FAILED: now_s},
            files=(),
            errors=checked.reported_errors(),
            owner=self._claim(spec),
        )
        return await self._read(spec.id)

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
        return await self._read(spec.id)

    def _claim(self, spec: JobSpec) -> JobOwner:
        """This region's claim on a job it creates (epoch 0): the job log's owner record and the fencing view."""
        return JobOwner(batch_id=spec.id, region=self.settings.region.name, at_ms=self.clock.now_ms())

    async def _read(self, batch_id: str) -> JobView:
        job = await self.store.jobs.get_job(batch_id)
        if job is None:  # written a moment ago: only a Redis flush gets here
            raise ApiError(500, f"Batch {batch_id} vanished after it was created", type=ErrorType.SERVER)
        return job

    async def get(self, principal: Principal, batch_id: str) -> JobView:
        job = await self.store.jobs.get_job(batch_id)
        if job is None or job.spec.tenant_id != principal.tenant_id:
            raise not_found("batch", batch_id)
        return job

    async def list(self, principal: Principal, after: str | None, limit: int) -> tuple[list[JobView], bool]:
        """The tenant's batches, newest first, after the batch ``after`` (an id from an earlier page)."""
        if not 1 <= limit <= 100:
            raise invalid(f"limit must be between 1 and 100, got {echo(limit)}", param="limit")
        cursor = await self.get(principal, after) if after else None
        return await self.store.jobs.list_jobs(principal.tenant_id, cursor, limit)

    async def cancel(self, principal: Principal, batch_id: str) -> JobView:
        """Ask for a cancel: ``cancelling`` now, ``cancelled`` once its running lines stopped (see the driver).
        Cancelling a cancelling or cancelled batch changes nothing; 409 for one that ended otherwise."""
        job = await self.get(principal, batch_id)
        now_ms = self.clock.now_ms()
        if await self.store.jobs.move_status(
            batch_id, [jobs.VALIDATING, jobs.IN_PROGRESS], jobs.CANCELLING, now_ms // 1000, end_ms=now_ms
        ):
            return await self._read(batch_id)
        job = await self._read(batch_id)
        if job.status in (jobs.CANCELLING, jobs.CANCELLED):
            return job
        raise ApiError(409, f"Cannot cancel a batch that is {job.status}", param="id", code="batch_not_cancellable")


def line_result_bytes(valid: validation.ValidRequest, context_window: int) -> int:
    """The most a line's stored result may take: its text budgeted at RESULT_BYTES_PER_TOKEN per token it may
    generate (n x effective max_tokens), at most the workers' MAX_RESULT_BYTES, plus the result's envelope."""
    tokens = valid.sampling.n * effective_max_tokens(valid, context_window)
    return min(MAX_RESULT_BYTES, tokens * RESULT_BYTES_PER_TOKEN) + RESULT_ENVELOPE_BYTES


def _repeats(request: CreateBatch, spec: JobSpec) -> bool:
    """Whether a create repeats the one that made ``spec`` (an Idempotency-Key retry) rather than asking for more."""
    policy = request.output_expires_after
    return (
        request.input_file_id,
        request.endpoint,
        request.completion_window,
        request.metadata,
        None if policy is None else policy.seconds,
    ) == (spec.input_file_id, spec.endpoint, spec.completion_window, spec.metadata, spec.output_expires_after_s)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid(f"metadata allows at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise invalid(
                f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most {MAX_METADATA_VALUE}",
                param=f"metadata.{echo(key, quote=False)}",
            )


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
        endpoint=jobs.BATCH_ENDPOINTS[spec.endpoint],
        created_ms=spec.created_ms,
    )

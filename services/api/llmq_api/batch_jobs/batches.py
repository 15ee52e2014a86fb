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
from collections.abc import AsyncIterator

import msgspec

from llmq_api import validation
from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs
from llmq_api.batch_jobs.access import check_deferred, not_found, owned_file, take_request
from llmq_api.batch_jobs.builder import InvalidInput, JobBuilder
from llmq_api.batch_jobs.expiry import OUTPUT_PARAM, ExpiresAfter, policy_seconds
from llmq_api.errors import ApiError, invalid
from llmq_core import ids
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY, OPENAI
from llmq_core.requests import echo
from llmq_jobs import jobs
from llmq_jobs.jobs import JobSpec, JobView

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class CreateBatch(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/batches`` (other OpenAI fields are accepted and ignored)."""

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchJobs:
    """``/v1/batches`` of one API pod, on ``builder``'s job engine (shared with ``/v1/messages/batches``): every
    POST takes a request from the tenant's requests per minute; a batch its lines' estimate from the batch quota."""

    def __init__(self, builder: JobBuilder) -> None:
        self.builder = builder
        self.settings, self.store, self.files = builder.settings, builder.store, builder.files
        self.clock, self.limiter = builder.clock, builder.limiter

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
        checker = self.builder.checker(spec.endpoint, self.settings.jobs.batch_max_lines)
        try:
            return await self.builder.build(spec, principal, self._file_lines(checker, source.path), checker.checked)
        except InvalidInput as failed:
            return await self.builder.fail(spec, failed.checked)

    async def _file_lines(self, checker: inputs.InputChecker, path: str) -> AsyncIterator[list[inputs.InputLine]]:
        """The input file's checked lines, a chunk's at a time, streamed from the store (each chunk checked in a
        thread); the rest is left unread once the file has too many lines."""
        async with contextlib.aclosing(self.files.iter_bytes(path)) as chunks:
            async for chunk in chunks:
                yield await asyncio.to_thread(checker.feed, chunk)
                if checker.stopped:
                    break
        yield checker.end()

    def _spec(
        self, batch_id: str, principal: Principal, request: CreateBatch, window_s: int, expires_after_s: int | None
    ) -> JobSpec:
        region = self.settings.region.name
        return self.builder.new_spec(
            batch_id,
            principal,
            request.endpoint,
            window_s,
            input_file_id=request.input_file_id,
            completion_window=request.completion_window,
            metadata=request.metadata,
            output_file_id=ids.file_id(region),
            error_file_id=ids.file_id(region),
            output_expires_after_s=expires_after_s,
        )

    async def get(self, principal: Principal, batch_id: str) -> JobView:
        job = await self.store.jobs.get_job(batch_id)
        if job is None or job.spec.tenant_id != principal.tenant_id or job.spec.api_format != OPENAI:
            raise not_found("batch", batch_id)  # a Message Batch is /v1/messages/batches' alone
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
            return await self.builder.read(batch_id)
        job = await self.builder.read(batch_id)
        if job.status in (jobs.CANCELLING, jobs.CANCELLED):
            return job
        raise ApiError(409, f"Cannot cancel a batch that is {job.status}", param="id", code="batch_not_cancellable")


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

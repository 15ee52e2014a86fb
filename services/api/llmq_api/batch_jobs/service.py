"""The API pod's side of files and batch jobs: store uploads, validate and create jobs, read them back, ask for a
cancel. Every object belongs to the tenant that created it; any other tenant gets the same 404 as for a missing one.

Creating a job is synchronous: the input file is validated line by line (in a thread) while the request waits, so a
batch is returned ``in_progress`` (its lines are in the ledger and the result-routers drive it) or ``failed`` (with
the structural errors). The API pod never produces lines itself: see :mod:`llmq_result_router.jobs`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import BinaryIO

import msgspec

from llmq_core import jobs, wire
from llmq_core.clock import Clock
from llmq_core.constants import CONTENT_TYPE_JSON, DEFERRED
from llmq_core.filestore import FileStore
from llmq_core.jobs import FileRecord, JobSpec, JobView
from llmq_core.jobstore import JobStore
from llmq_core.settings import Settings
from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs, render
from llmq_api.errors import ApiError, invalid

UPLOAD_CHUNK_BYTES = 1 << 20
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_json = msgspec.json.encode


class CreateBatch(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/batches`` (other OpenAI fields are accepted and ignored)."""

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind}: '{object_id}'", param="id", code="not_found")


class BatchJobs:
    """Files and jobs of one API pod. ``models()`` gives the served models (name -> context window)."""

    def __init__(self, settings: Settings, store: JobStore, files: FileStore, clock: Clock,
                 models: Callable[[], Mapping[str, int]]) -> None:
        self.settings = settings
        self.store = store
        self.files = files
        self.clock = clock
        self.models = models

    # --- files ----------------------------------------------------------------------------------------------------

    async def upload(self, principal: Principal, filename: str, purpose: str, source: BinaryIO) -> FileRecord:
        """Store an uploaded input file (``purpose`` must be ``batch``). 413 past ``files_max_bytes``."""
        if purpose != jobs.FILE_PURPOSE_BATCH:
            raise invalid(f"purpose must be '{jobs.FILE_PURPOSE_BATCH}', got {purpose!r}", param="purpose")
        file_id = f"file-{uuid.uuid4().hex}"
        path = f"files/{file_id}"
        limit = self.settings.files_max_bytes
        try:
            size = await self.files.write(path, _chunks(source, limit))
        except _TooLarge:
            await self.files.delete(path)
            raise ApiError(413, f"File is larger than the limit of {limit} bytes", param="file",
                           code="file_too_large") from None
        now_s = self.clock.now_ms() // 1000
        record = FileRecord(id=file_id, tenant_id=principal.tenant_id, filename=filename or "upload.jsonl",
                            purpose=purpose, bytes=size, created_at=now_s,
                            expires_at=now_s + self.settings.files_retention_s, path=path)
        await self.store.put_file(record)
        return record

    async def get_file(self, principal: Principal, file_id: str) -> FileRecord:
        record = await self.store.get_file(file_id)
        if record is None or record.tenant_id != principal.tenant_id:
            raise not_found("file", file_id)
        return record

    async def list_files(self, principal: Principal, purpose: str | None, limit: int) -> list[FileRecord]:
        records = await self.store.list_files(principal.tenant_id, limit)
        return [r for r in records if purpose is None or r.purpose == purpose]

    async def delete_file(self, principal: Principal, file_id: str) -> None:
        """Forget the file; an input file's bytes go too (a job's results stay with the job)."""
        record = await self.get_file(principal, file_id)
        await self.store.delete_file(record)
        if record.kind == "input":
            await self.files.delete(record.path)

    async def content(self, principal: Principal, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes: an upload as stored; a job's output or error file rendered from its results so far
        (partial while the job runs). Raises 404 before the first chunk."""
        record = await self.get_file(principal, file_id)
        if record.kind == "input":
            if not await self.files.exists(record.path):
                raise not_found("file", file_id)
            return self.files.iter_bytes(record.path)
        job = await self.store.get_job(record.batch_id or "")
        if job is None:
            raise not_found("file", file_id)
        results = await self._results(job)
        return _render_lines(results, want_success=record.kind == "output")

    async def _results(self, job: JobView) -> list[wire.FinalResult]:
        """A job's results: from the ledger while it runs, from its results file once it has ended."""
        if job.status not in jobs.TERMINAL_STATUSES:
            results = [r async for r in self.store.scan_results(job.spec.id)]
            job = await self.store.get_job(job.spec.id) or job
            if job.status not in jobs.TERMINAL_STATUSES:
                return results
        if job.status == jobs.FAILED:
            return []
        data = await self.files.read(job.spec.results_path)
        return [msgspec.json.decode(line, type=wire.FinalResult) for line in data.splitlines() if line]

    # --- batches --------------------------------------------------------------------------------------------------

    async def create(self, principal: Principal, body: bytes, idempotency_key: str | None = None) -> JobView:
        """Validate and create a job from a ``POST /v1/batches`` body. A repeated ``idempotency_key`` returns the
        batch it created (nothing runs twice). Raises 400 (bad body, endpoint, window, metadata, input file purpose),
        403 (the key may not use the deferred class), 404 (input file), 409 (the same key's batch is being created)."""
        if DEFERRED not in principal.classes:
            raise ApiError(403, "This API key may not use the deferred class that batches run in",
                           type="permission_error", code="class_not_allowed")
        request = _decode_create(body)
        batch_id = f"batch_{uuid.uuid4().hex}"
        if idempotency_key is None:
            return await self._create(principal, request, batch_id)
        earlier = await self.store.claim_batch_key(principal.tenant_id, idempotency_key, batch_id,
                                                   self.settings.files_retention_s)
        if earlier is not None:
            job = await self.store.get_job(earlier)
            if job is None:
                raise ApiError(409, "A batch with this Idempotency-Key is being created; retry shortly",
                               code="idempotency_key_in_use", retryable=True)
            return job
        try:
            return await self._create(principal, request, batch_id)
        except BaseException:
            await self.store.release_batch_key(principal.tenant_id, idempotency_key)
            raise

    async def _create(self, principal: Principal, request: CreateBatch, batch_id: str) -> JobView:
        endpoint = request.endpoint
        if endpoint not in jobs.BATCH_ENDPOINTS:
            raise invalid(f"endpoint must be one of {', '.join(jobs.BATCH_ENDPOINTS)}, got {endpoint!r}",
                          param="endpoint", code="invalid_endpoint")
        try:
            window_s = jobs.parse_window(request.completion_window, self.settings.batch_max_window_s)
        except ValueError as exc:
            raise invalid(str(exc), param="completion_window", code="invalid_completion_window") from None
        _check_metadata(request.metadata)
        source = await self.get_file(principal, request.input_file_id)
        if source.purpose != jobs.FILE_PURPOSE_BATCH or source.kind != "input":
            raise invalid(f"File {source.id} does not have purpose 'batch'", param="input_file_id")
        data = await self.files.read(source.path)
        limits = inputs.Limits(self.settings.batch_max_lines, self.settings.batch_max_line_bytes)
        checked = await asyncio.to_thread(inputs.check_input, data, endpoint, self.models(), limits)
        spec = self._spec(batch_id, principal, request, window_s, checked)
        if checked.errors:
            return await self._fail(spec, checked)
        return await self._start(spec, principal, checked)

    def _spec(self, batch_id: str, principal: Principal, request: CreateBatch, window_s: int,
              checked: inputs.CheckedInput) -> JobSpec:
        now_ms = self.clock.now_ms()
        return JobSpec(id=batch_id, tenant_id=principal.tenant_id, endpoint=request.endpoint,
                       input_file_id=request.input_file_id, completion_window=request.completion_window,
                       created_ms=now_ms, expires_ms=now_ms + window_s * 1000, metadata=request.metadata,
                       output_file_id=f"file-{uuid.uuid4().hex}", error_file_id=f"file-{uuid.uuid4().hex}",
                       total=len(checked.lines), runnable=sum(1 for line in checked.lines if line.valid),
                       prepared_path=f"jobs/{batch_id}/requests.jsonl", results_path=f"jobs/{batch_id}/results.jsonl")

    async def _fail(self, spec: JobSpec, checked: inputs.CheckedInput) -> JobView:
        now_s = spec.created_ms // 1000
        spec = msgspec.structs.replace(spec, total=0, runnable=0)
        await self.store.create_job(spec, jobs.FAILED, {jobs.VALIDATING: now_s, jobs.FAILED: now_s}, files=(),
                                    errors=checked.reported_errors())
        return await self._read(spec.id)

    async def _start(self, spec: JobSpec, principal: Principal, checked: inputs.CheckedInput) -> JobView:
        prepared, lines, offsets, results = [], {}, {}, {}
        position = 0
        for line in checked.lines:
            if line.error is not None:
                lines[line.custom_id] = jobs.ERRORED
                results[line.custom_id] = _rejected(spec, principal, line)
                continue
            encoded = wire.encode(_request(spec, principal, line), CONTENT_TYPE_JSON) + b"\n"
            prepared.append(encoded)
            offsets[line.custom_id] = f"{position}:{position + len(encoded)}"
            position += len(encoded)
            lines[line.custom_id] = jobs.pending(0)
        await self.files.write(spec.prepared_path, prepared)
        now_s = self.clock.now_ms() // 1000
        expires_at = spec.expires_ms // 1000 + self.settings.files_retention_s
        outputs = [FileRecord(id=file_id, tenant_id=spec.tenant_id, filename=f"{spec.id}_{kind}.jsonl",
                              purpose=jobs.FILE_PURPOSE_OUTPUT, created_at=now_s, expires_at=expires_at,
                              path=spec.results_path, batch_id=spec.id, kind=kind)
                   for file_id, kind in ((spec.output_file_id, "output"), (spec.error_file_id, "error"))]
        await self.store.create_job(spec, jobs.IN_PROGRESS, {jobs.VALIDATING: spec.created_ms // 1000,
                                                             jobs.IN_PROGRESS: now_s},
                                    files=outputs, lines=lines, offsets=offsets, results=results)
        return await self._read(spec.id)

    async def _read(self, batch_id: str) -> JobView:
        job = await self.store.get_job(batch_id)
        if job is None:  # written a moment ago: only a Redis flush gets here
            raise ApiError(500, f"Batch {batch_id} vanished after it was created", type="server_error")
        return job

    async def get(self, principal: Principal, batch_id: str) -> JobView:
        job = await self.store.get_job(batch_id)
        if job is None or job.spec.tenant_id != principal.tenant_id:
            raise not_found("batch", batch_id)
        return job

    async def list(self, principal: Principal, after: str | None, limit: int) -> tuple[list[JobView], bool]:
        """The tenant's batches, newest first, after the batch ``after`` (an id from an earlier page)."""
        if not 1 <= limit <= 100:
            raise invalid(f"limit must be between 1 and 100, got {limit}", param="limit")
        cursor = await self.get(principal, after) if after else None
        return await self.store.list_jobs(principal.tenant_id, cursor, limit)

    async def cancel(self, principal: Principal, batch_id: str) -> JobView:
        """Ask for a cancel: ``cancelling`` now, ``cancelled`` once its running lines stopped (see the driver).
        Cancelling a cancelling or cancelled batch changes nothing; 409 for one that ended otherwise."""
        job = await self.get(principal, batch_id)
        now_ms = self.clock.now_ms()
        if await self.store.move_status(batch_id, [jobs.VALIDATING, jobs.IN_PROGRESS], jobs.CANCELLING,
                                        now_ms // 1000, end_ms=now_ms):
            return await self._read(batch_id)
        job = await self._read(batch_id)
        if job.status in (jobs.CANCELLING, jobs.CANCELLED):
            return job
        raise ApiError(409, f"Cannot cancel a batch that is {job.status}", param="id", code="batch_not_cancellable")


class _TooLarge(Exception):
    pass


def _chunks(source: BinaryIO, limit: int) -> Iterator[bytes]:
    size = 0
    while chunk := source.read(UPLOAD_CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        yield chunk


def _decode_create(body: bytes) -> CreateBatch:
    try:
        return msgspec.json.decode(body, type=CreateBatch)
    except msgspec.ValidationError as exc:
        raise invalid(f"Invalid request: {exc}", code="invalid_type") from None
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise invalid(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid(f"metadata allows at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise invalid(f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most "
                          f"{MAX_METADATA_VALUE}", param=f"metadata.{key[:64]}")


def _request(spec: JobSpec, principal: Principal, line: inputs.InputLine) -> wire.GenerationRequest:
    """Round 0 of a line as the result-router will produce it (``created_ms`` is stamped then)."""
    valid = line.valid
    return wire.GenerationRequest(
        request_id=jobs.line_request_id(spec.id, line.custom_id), tenant_id=spec.tenant_id, traffic_class=DEFERRED,
        tier=principal.tier, model=valid.model, endpoint=valid.endpoint, prompt=valid.prompt, messages=valid.messages,
        sampling=valid.sampling, created_ms=spec.created_ms, deadline_ms=spec.expires_ms,
        reply_to=wire.JobReply(batch_id=spec.id, custom_id=line.custom_id), prompt_tokens=valid.prompt_tokens)


def _rejected(spec: JobSpec, principal: Principal, line: inputs.InputLine) -> wire.FinalResult:
    """The errored result of a line whose body failed validation: it never runs."""
    error = line.error
    return wire.FinalResult(
        request_id=jobs.line_request_id(spec.id, line.custom_id), outcome=wire.Outcome.ERRORED, model=line.model,
        tenant_id=principal.tenant_id, endpoint=jobs.BATCH_ENDPOINTS[spec.endpoint],
        reply_to=wire.JobReply(batch_id=spec.id, custom_id=line.custom_id),
        error=wire.ErrorInfo(type=error.type, message=error.message, code=error.code),
        created_ms=spec.created_ms, finished_ms=spec.created_ms)


async def _render_lines(results: list[wire.FinalResult], want_success: bool) -> AsyncIterator[bytes]:
    for result in results:
        succeeded, line = render.output_line(result)
        if succeeded == want_success:
            yield _json(line) + b"\n"

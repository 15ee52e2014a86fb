"""The API pod's side of ``/v1/files``: store uploads within the tenant's storage quota, list, read and delete them,
and serve a job's output and error files rendered from its results.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import BinaryIO

import msgspec

from llmq_api.auth import Principal
from llmq_api.batch_jobs.access import check_deferred, not_found, owned_file, take_request
from llmq_api.errors import ApiError, invalid
from llmq_api.ratelimit import RateLimiter
from llmq_core import ids, wire
from llmq_core.clock import Clock
from llmq_core.requests import echo
from llmq_core.settings import Settings
from llmq_jobs import jobs, lines
from llmq_jobs.filestore import FileStore
from llmq_jobs.jobs import FileRecord, JobView
from llmq_jobs.store import JobStore

log = logging.getLogger(__name__)

MAX_FILES_PAGE = 10_000  # OpenAI's bound on GET /v1/files?limit
LIST_ORDERS = ("asc", "desc")  # GET /v1/files?order: by created_at
UPLOAD_CHUNK_BYTES = 1 << 20
_json = msgspec.json.encode


class BatchFiles:
    """Files of one API pod: records in ``store``, bytes in ``files``; ``limiter`` the tenants' buckets (every upload
    takes a request)."""

    def __init__(
        self, settings: Settings, store: JobStore, files: FileStore, clock: Clock, limiter: RateLimiter
    ) -> None:
        self.settings = settings
        self.store = store
        self.files = files
        self.clock = clock
        self.limiter = limiter

    async def admit_upload(self, principal: Principal) -> None:
        """Before an upload is read: 403 for a key that may not use the deferred class (files only feed batches),
        429 past the tenant's requests per minute, 400 when its storage quota is full already."""
        check_deferred(principal, "upload files for batches")
        await take_request(self.limiter, principal)
        quota, used = await self._storage(principal)
        if used >= quota:
            raise self._over_quota(quota, used)

    async def upload(
        self, principal: Principal, filename: str, purpose: str, source: BinaryIO, expires_after_s: int | None = None
    ) -> FileRecord:
        """Store an uploaded input file (``purpose`` must be ``batch``), kept ``expires_after_s`` (its
        ``expires_after``; at most, and by default, ``files_retention_s``). 413 past ``files_max_bytes``; 400 past the
        tenant's storage quota (the bytes of its live uploads)."""
        if purpose != jobs.FILE_PURPOSE_BATCH:
            raise invalid(f"purpose must be '{jobs.FILE_PURPOSE_BATCH}', got {echo(purpose)}", param="purpose")
        file_id = ids.file_id(self.settings.region.name)
        path = f"files/{file_id}"
        quota, used = await self._storage(principal)
        limit = min(self.settings.jobs.files_max_bytes, quota - used)
        try:
            size = await self.files.write(path, _chunks(source, limit))
        except _TooLarge:
            await self.files.delete(path)
            if limit < self.settings.jobs.files_max_bytes:
                raise self._over_quota(quota, used) from None
            raise ApiError(
                413, f"File is larger than the limit of {limit} bytes", param="file", code="file_too_large"
            ) from None
        try:
            reserved = await self.store.quotas.reserve_storage(principal.tenant_id, size, quota)
        except BaseException:  # Redis refused the reservation (503): no sweep would ever find these bytes
            await self.files.delete(path)
            raise
        if reserved is None:  # a concurrent upload won
            await self.files.delete(path)
            raise self._over_quota(quota, await self.store.quotas.stored_bytes(principal.tenant_id))
        now_s = self.clock.now_ms() // 1000
        record = FileRecord(
            id=file_id,
            tenant_id=principal.tenant_id,
            filename=filename or "upload.jsonl",
            purpose=purpose,
            bytes=size,
            created_at=now_s,
            expires_at=now_s + jobs.kept_s(expires_after_s, self.settings.jobs.files_retention_s),
            path=path,
        )
        try:
            await self.store.files.put_file(record)
        except BaseException:
            try:
                await self.store.quotas.release_storage(principal.tenant_id, size)
            finally:  # Redis refused the record (503): no sweep would ever find these bytes
                await self.files.delete(path)
            raise
        return record

    async def _storage(self, principal: Principal) -> tuple[int, int]:
        """(the tenant's storage quota, the bytes its live uploads take now)."""
        quota = principal.file_storage_bytes or self.settings.jobs.files_tenant_max_bytes
        return quota, await self.store.quotas.stored_bytes(principal.tenant_id)

    @staticmethod
    def _over_quota(quota: int, used: int) -> ApiError:
        return invalid(
            f"This upload would exceed the tenant's file storage quota of {quota} bytes ({used} bytes "
            "in use by live files); delete files (DELETE /v1/files/{id}) to make room",
            param="file",
            code="storage_quota_exceeded",
        )

    async def get_file(self, principal: Principal, file_id: str) -> FileRecord:
        return await self._sized(await owned_file(self.store.files, principal, file_id))

    async def _sized(self, record: FileRecord) -> FileRecord:
        """``record`` with its ``bytes``: an output or error file's are counted by rendering it once its job has
        ended (kept in the record from then on); while the job runs they are 0, as the file is not final."""
        if record.kind == "input" or record.sized:
            return record
        job = await self.store.jobs.get_job(record.batch_id or "")
        if job is None or job.status not in jobs.TERMINAL_STATUSES:
            return record
        try:
            results = await self._results(job)
        except FileNotFoundError:  # ended, its results file not written yet (or lost): sized on a later read
            log.warning("the results file of ended batch %s is missing: %s unsized", job.spec.id, record.id)
            return record
        size = 0
        async for line in _render_lines(results, want_success=record.kind == "output"):
            size += len(line)
        record = msgspec.structs.replace(record, bytes=size, sized=True)
        await self.store.files.update_file(record)
        return record

    async def list_files(
        self, principal: Principal, purpose: str | None, after: str | None, limit: int, order: str = "desc"
    ) -> tuple[list[FileRecord], bool]:
        """A page of the tenant's files of ``purpose`` (None: any), newest first (``order`` ``asc``: oldest first),
        after the file ``after``."""
        if not 1 <= limit <= MAX_FILES_PAGE:
            raise invalid(f"limit must be between 1 and {MAX_FILES_PAGE}, got {echo(limit)}", param="limit")
        if order not in LIST_ORDERS:
            raise invalid(f"order must be one of {', '.join(LIST_ORDERS)}, got {echo(order)}", param="order")
        cursor = await owned_file(self.store.files, principal, after) if after else None
        records, has_more = await self.store.files.list_files(
            principal.tenant_id, cursor, limit, purpose, order == "asc"
        )
        return [await self._sized(record) for record in records], has_more

    async def delete_file(self, principal: Principal, file_id: str) -> None:
        """Forget the file; an input file's bytes go too (a job's results stay with the job)."""
        record = await owned_file(self.store.files, principal, file_id)
        await self.store.files.delete_file(record)
        if record.kind == "input":
            await self.files.delete(record.path)

    async def content(self, principal: Principal, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes: an upload as stored; a job's output or error file rendered from its results so far
        (partial while the job runs). Raises 404 before the first chunk."""
        record = await owned_file(self.store.files, principal, file_id)
        if record.kind == "input":
            if not await self.files.exists(record.path):
                raise not_found("file", file_id)
            return self.files.iter_bytes(record.path)
        job = await self.store.jobs.get_job(record.batch_id or "")
        if job is None:
            raise not_found("file", file_id)
        try:
            results = await self._results(job)
        except FileNotFoundError:  # its job ended without a results file (lost from the store)
            raise not_found("file", file_id) from None
        return _render_lines(results, want_success=record.kind == "output")

    async def _results(self, job: JobView) -> list[wire.FinalResult]:
        """A job's results: from the ledger while it runs, from its results file once it has ended."""
        if job.status not in jobs.TERMINAL_STATUSES:
            results = [r async for r in self.store.ledger.scan_results(job.spec.id)]
            job = await self.store.jobs.get_job(job.spec.id) or job
            if job.status not in jobs.TERMINAL_STATUSES:
                return results
        if job.status == jobs.FAILED:
            return []
        data = await self.files.read(job.spec.results_path)
        return [msgspec.json.decode(line, type=wire.FinalResult) for line in data.splitlines() if line]


class _TooLarge(Exception):
    pass


def _chunks(source: BinaryIO, limit: int) -> Iterator[bytes]:
    size = 0
    while chunk := source.read(UPLOAD_CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        yield chunk


async def _render_lines(results: list[wire.FinalResult], want_success: bool) -> AsyncIterator[bytes]:
    for result in results:
        succeeded, line = lines.output_line(result)
        if succeeded == want_success:
            yield _json(line) + b"\n"

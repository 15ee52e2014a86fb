"""Fakes shared by the API unit tests."""

from __future__ import annotations

import asyncio

import msgspec

from llmq_core import wire
from llmq_core.labels import DEV_TENANT
from llmq_jobs import jobs


def final(
    request_id: str,
    text: str = "hello",
    outcome: wire.Outcome = wire.Outcome.SUCCEEDED,
    error: wire.ErrorInfo | None = None,
    finish_reason: str = "length",
    tenant_id: str = DEV_TENANT,  # the tenant of llmq-dev-key, which the test clients send
) -> wire.FinalResult:
    return wire.FinalResult(
        request_id=request_id,
        tenant_id=tenant_id,
        outcome=outcome,
        model="llmq-sim",
        reply_to=wire.HttpReply(instance_id="pod"),
        error=error,
        choices=[wire.Choice(index=0, text=text, finish_reason=finish_reason)],
        usage=wire.Usage(prompt_tokens=3, completion_tokens=len(text), total_tokens=3 + len(text)),
    )


def refusal(rejection) -> tuple:
    """An admission or rate-limit refusal as its caller learns it: (reason, status, type, code, param, headers)."""
    error = rejection.error
    return rejection.reason, error.status, error.type, error.code, error.param, error.headers


def chunk(request_id: str, text: str, seq: int, index: int = 0, attempt: int = 0, offset: int = -1) -> wire.TokenChunk:
    return wire.TokenChunk(
        request_id=request_id, index=index, text=text, seq=seq, sent_ms=0, attempt=attempt, offset=offset
    )


class CancelRecorder:
    """A CancelPublisher that records (request_id, reason)."""

    def __init__(self) -> None:
        self.cancels: list[tuple[str, str]] = []

    async def __call__(self, request_id: str, reason: str) -> None:
        self.cancels.append((request_id, reason))


class Trigger:
    """An awaitable the test fires by hand (stands in for a deadline timer or a disconnect)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


class MemoryFiles:
    """In memory, the FileIndex calls of the /v1/files routes."""

    def __init__(self, quotas: MemoryQuotas) -> None:
        self.records: dict = {}
        self.quotas = quotas

    async def put_file(self, record) -> None:
        self.records[record.id] = record

    async def get_file(self, file_id: str):
        return self.records.get(file_id)

    async def update_file(self, record) -> None:
        if record.id in self.records:
            self.records[record.id] = record

    async def delete_file(self, record) -> None:
        if self.records.pop(record.id, None) is not None and record.kind == "input":
            await self.quotas.release_storage(record.tenant_id, record.bytes)

    async def list_files(self, tenant_id: str, after, limit: int, purpose=None, ascending=False) -> tuple[list, bool]:
        listed = [r for r in self.records.values() if r.tenant_id == tenant_id]
        listed = listed if ascending else listed[::-1]
        if after is not None:
            listed = listed[listed.index(after) + 1 :]
        listed = [r for r in listed if purpose is None or r.purpose == purpose]
        return listed[:limit], len(listed) > limit


class MemoryQuotas:
    """In memory, the tenants' storage and result-byte counters."""

    def __init__(self) -> None:
        self.storage: dict[str, int] = {}
        self.result_bytes: dict[str, int] = {}

    async def reserve_storage(self, tenant_id: str, size: int, quota: int) -> int | None:
        return _reserve(self.storage, tenant_id, size, quota)

    async def release_storage(self, tenant_id: str, size: int) -> None:
        _reserve(self.storage, tenant_id, -size)

    async def stored_bytes(self, tenant_id: str) -> int:
        return self.storage.get(tenant_id, 0)

    async def reserve_result_bytes(self, tenant_id: str, size: int, bound: int) -> int | None:
        return _reserve(self.result_bytes, tenant_id, size, bound)

    async def unreserve_result_bytes(self, tenant_id: str, size: int) -> None:
        _reserve(self.result_bytes, tenant_id, -size)


class MemoryJobs:
    """In memory, the JobTable calls of the /v1/batches routes (a created job's output files go to ``files``)."""

    def __init__(self, files: MemoryFiles) -> None:
        self.views: dict = {}
        self.batch_keys: dict[tuple[str, str], str] = {}
        self.files = files

    async def create_job(
        self,
        spec,
        status: str,
        times,
        *,
        files,
        lines=None,
        offsets=None,
        results=None,
        errors=(),
        errored: int = 0,
        owner=None,
    ) -> None:
        for record in files:
            self.files.records[record.id] = record
        self.views[spec.id] = jobs.JobView(
            spec=spec,
            status=status,
            times=dict(times),
            errors=list(errors),
            counts={"errored": len(results or ()) + errored},
        )

    async def claim_batch_key(self, tenant_id: str, key: str, batch_id: str, ttl_s: int) -> str | None:
        earlier = self.batch_keys.setdefault((tenant_id, key), batch_id)
        return None if earlier == batch_id else earlier

    async def release_batch_key(self, tenant_id: str, key: str) -> None:
        self.batch_keys.pop((tenant_id, key), None)

    async def get_job(self, batch_id: str):
        return self.views.get(batch_id)

    async def list_jobs(self, tenant_id: str, after, limit: int) -> tuple[list, bool]:
        views = [v for v in self.views.values() if v.spec.tenant_id == tenant_id][::-1]
        if after is not None:
            views = views[[v.spec.id for v in views].index(after.spec.id) + 1 :]
        return views[:limit], len(views) > limit

    async def move_status(self, batch_id: str, allowed, status: str, at_s: int, end_ms: int | None = None) -> bool:
        job = self.views[batch_id]
        if job.status not in allowed:
            return False
        self.views[batch_id] = msgspec.structs.replace(job, status=status, end_ms=end_ms or 0)
        return True


class MemoryLedger:
    """No ledger here: the routes write slices of it and read results, never line states."""

    async def add_lines(self, batch_id: str, lines, offsets, results, requests=None) -> None:
        pass

    async def discard_ledger(self, batch_id: str) -> None:
        pass

    async def scan_results(self, batch_id: str):
        return
        yield


class MemoryJobStore:
    """In memory, the JobStore parts the API pod's /v1/files and /v1/batches routes call (no ledger, no driver)."""

    def __init__(self) -> None:
        self.quotas = MemoryQuotas()
        self.files = MemoryFiles(self.quotas)
        self.jobs = MemoryJobs(self.files)
        self.ledger = MemoryLedger()


def _reserve(used_by_tenant: dict[str, int], tenant_id: str, size: int, bound: float = float("inf")) -> int | None:
    """Add ``size`` to the tenant's count unless that passes ``bound`` (then None); what it counted before."""
    used = used_by_tenant.get(tenant_id, 0)
    if used + size > bound:
        return None
    used_by_tenant[tenant_id] = used + size
    return used

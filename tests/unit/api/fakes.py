"""Fakes shared by the API unit tests."""

import asyncio

import msgspec

from llmq_core import jobs, wire


def final(
    request_id: str,
    text: str = "hello",
    outcome: wire.Outcome = wire.Outcome.SUCCEEDED,
    error: wire.ErrorInfo | None = None,
    finish_reason: str = "length",
) -> wire.FinalResult:
    return wire.FinalResult(
        request_id=request_id,
        outcome=outcome,
        model="llmq-sim",
        reply_to=wire.HttpReply(instance_id="pod"),
        error=error,
        choices=[wire.Choice(index=0, text=text, finish_reason=finish_reason)],
        usage=wire.Usage(prompt_tokens=3, completion_tokens=len(text), total_tokens=3 + len(text)),
    )


def chunk(request_id: str, text: str, seq: int, index: int = 0, attempt: int = 0) -> wire.TokenChunk:
    return wire.TokenChunk(request_id=request_id, index=index, text=text, seq=seq, sent_ms=0, attempt=attempt)


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


class FakeRedis:
    """In memory, the Redis calls an API pod makes (no expiry). Scripts: the idempotency release compares and deletes;
    the rate limiter's take answers ``take_reply`` ({1, 0, 0}: granted) and records its keys and args in ``takes``,
    its refund in ``gives``."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.data: dict[str, bytes] = {}
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        self.take_reply = [1, 0, 0]
        self.takes: list[tuple[list, list]] = []
        self.gives: list[tuple[list, list]] = []

    async def publish(self, channel: str, data: bytes) -> int:
        self.published.append((channel, data))
        return 0

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    async def set(self, key: str, value: bytes, nx: bool = False, px: int | None = None) -> bool | None:
        if nx and key in self.data:
            return None
        self.data[key] = value
        return True

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        return dict(self.hashes.get(key, {}))

    async def hset(self, key: str, field: str, value: bytes) -> int:
        fields = self.hashes.setdefault(key, {})
        new = field.encode() not in fields
        fields[field.encode()] = value
        return int(new)

    async def hdel(self, key: str, *fields: bytes) -> int:
        return sum(self.hashes.get(key, {}).pop(f, None) is not None for f in fields)

    def register_script(self, script: str):
        async def run(keys: list, args: list):
            if "cjson" in script:  # release: delete while the claim names this request
                claim = self.data.get(keys[0])
                if claim and msgspec.json.decode(claim)["request_id"] == args[0]:
                    del self.data[keys[0]]
                    return 1
                return 0
            if "ZPOPMIN" in script:  # the result-router's ResultStore.put: first stored wins, no bound
                return [int(bool(await self.set(keys[0], args[0], nx=True))), 0]
            if "amount" in script:  # the rate limiter's refund
                self.gives.append((keys, args))
                return 1
            self.takes.append((keys, args))
            return list(self.take_reply)

        return run


class MemoryJobStore:
    """In memory, the JobStore calls the API pod's /v1/files and /v1/batches routes make (no ledger, no driver)."""

    def __init__(self) -> None:
        self.files: dict = {}
        self.jobs: dict = {}
        self.batch_keys: dict[tuple[str, str], str] = {}
        self.storage: dict[str, int] = {}
        self.result_bytes: dict[str, int] = {}

    async def put_file(self, record) -> None:
        self.files[record.id] = record

    async def get_file(self, file_id: str):
        return self.files.get(file_id)

    async def delete_file(self, record) -> None:
        if self.files.pop(record.id, None) is not None and record.kind == "input":
            await self.release_storage(record.tenant_id, record.bytes)

    async def reserve_storage(self, tenant_id: str, size: int, quota: int) -> int | None:
        used = self.storage.get(tenant_id, 0)
        if used + size > quota:
            return None
        self.storage[tenant_id] = used + size
        return used

    async def release_storage(self, tenant_id: str, size: int) -> None:
        self.storage[tenant_id] = self.storage.get(tenant_id, 0) - size

    async def stored_bytes(self, tenant_id: str) -> int:
        return self.storage.get(tenant_id, 0)

    async def reserve_result_bytes(self, tenant_id: str, size: int, bound: int) -> int | None:
        used = self.result_bytes.get(tenant_id, 0)
        if used + size > bound:
            return None
        self.result_bytes[tenant_id] = used + size
        return used

    async def unreserve_result_bytes(self, tenant_id: str, size: int) -> None:
        self.result_bytes[tenant_id] = self.result_bytes.get(tenant_id, 0) - size

    async def list_files(self, tenant_id: str, after, limit: int) -> tuple[list, bool]:
        newest_first = [r for r in self.files.values() if r.tenant_id == tenant_id][::-1]
        if after is not None:
            newest_first = newest_first[newest_first.index(after) + 1 :]
        return newest_first[:limit], len(newest_first) > limit

    async def create_job(
        self, spec, status: str, times, *, files, lines=None, offsets=None, results=None, errors=(), errored: int = 0
    ) -> None:
        for record in files:
            self.files[record.id] = record
        self.jobs[spec.id] = jobs.JobView(
            spec=spec,
            status=status,
            times=dict(times),
            errors=list(errors),
            counts={"errored": len(results or ()) + errored},
        )

    async def add_lines(self, batch_id: str, lines, offsets, results) -> None:
        pass  # no ledger here: the routes never read it

    async def discard_ledger(self, batch_id: str) -> None:
        pass

    async def claim_batch_key(self, tenant_id: str, key: str, batch_id: str, ttl_s: int) -> str | None:
        earlier = self.batch_keys.setdefault((tenant_id, key), batch_id)
        return None if earlier == batch_id else earlier

    async def release_batch_key(self, tenant_id: str, key: str) -> None:
        self.batch_keys.pop((tenant_id, key), None)

    async def get_job(self, batch_id: str):
        return self.jobs.get(batch_id)

    async def list_jobs(self, tenant_id: str, after, limit: int) -> tuple[list, bool]:
        views = [v for v in self.jobs.values() if v.spec.tenant_id == tenant_id][::-1]
        if after is not None:
            views = views[[v.spec.id for v in views].index(after.spec.id) + 1 :]
        return views[:limit], len(views) > limit

    async def move_status(self, batch_id: str, allowed, status: str, at_s: int, end_ms: int | None = None) -> bool:
        job = self.jobs[batch_id]
        if job.status not in allowed:
            return False
        self.jobs[batch_id] = msgspec.structs.replace(job, status=status, end_ms=end_ms or 0)
        return True

    async def scan_results(self, batch_id: str):
        return
        yield

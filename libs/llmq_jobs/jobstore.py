"""Batch jobs and files in Redis: records, tenant listings, the per-line ledger and the driver's lease.

Shared by the API pod (creates files and jobs, reads them, asks for a cancel) and the result-router (settles lines,
drives jobs). Every change of a line's state is a compare-and-set in one Lua script together with its counters, so a
result delivered twice, a stale retry round, or a cancel racing a result changes the ledger at most once.
Key names: :mod:`llmq_jobs.jobs`.

With a :class:`~llmq_jobs.joblog.JobLog` (every service's store has one; tests of pure Redis behaviour may go
without), Redis is a view of the job topics: a job, its lines and every terminal result are written to Kafka before
Redis, a status move right after it applied, and :meth:`JobStore.restore_job` rebuilds the view from the topics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec
from redis.asyncio import Redis

from llmq_core import constants, wire
from llmq_jobs import jobs
from llmq_jobs.joblog import JobLog
from llmq_jobs.jobs import FileRecord, JobOwner, JobRecord, JobSpec, JobView, LineError

_json = msgspec.json.encode

# KEYS: lines, results, job, retries. ARGV: custom_id, expected state, new state, result ('' keeps), retry due ms
# ('' drops the line from the retry zset), then (counter, increment) pairs. Returns 1 when applied, 0 when the line
# was not in the expected state.
_SETTLE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
if ARGV[5] == '' then redis.call('ZREM', KEYS[4], ARGV[1]) else redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1]) end
for i = 6, #ARGV, 2 do redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS: lines. ARGV: custom_id, expected, new. Plain compare-and-set of one line's state.
_CAS_LINE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

# KEYS: lines, retries. ARGV: custom_id, state. Drop the line from the retry zset if it is still in that state.
_UNQUEUE_RETRY = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('ZREM', KEYS[2], ARGV[1])
"""

# KEYS: job. ARGV: comma-separated statuses allowed now, new status, epoch s, end_ms ('' leaves it). 1 when moved.
_MOVE_STATUS = """
local now = redis.call('HGET', KEYS[1], 'status')
if not now then return 0 end
local allowed = false
for status in string.gmatch(ARGV[1], '[^,]+') do if status == now then allowed = true end end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'at:' .. ARGV[2], ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'end_ms', ARGV[4]) end
return 1
"""

# KEYS: lease. ARGV: token, ttl ms. Take a free lease or extend our own; 1 when we hold it afterwards.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# KEYS: the tenant's storage counter. ARGV: bytes, quota. Adds the bytes when they fit under the quota; returns the
# bytes in use before (-1 when they do not fit).
_RESERVE_STORAGE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return -1 end
redis.call('INCRBY', KEYS[1], ARGV[1])
return used
"""

# KEYS: the file's record, the tenant's listing, the expiry zset, the tenant's storage counter. ARGV: listing member,
# file id, bytes. Forgets the file; its bytes leave the storage counter only if the record still existed (once).
_DELETE_FILE = """
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
if existed == 1 and tonumber(ARGV[3]) > 0 then redis.call('DECRBY', KEYS[4], ARGV[3]) end
return existed
"""

# KEYS: the job, its tenant's result-bytes counter. Gives back the job's reservation once (the field goes with it).
_RELEASE_RESULT_BYTES = """
local reserved = redis.call('HGET', KEYS[1], 'result_bytes')
if not reserved then return 0 end
redis.call('HDEL', KEYS[1], 'result_bytes')
return redis.call('DECRBY', KEYS[2], reserved)
"""


# KEYS: job. ARGV: region, epoch. Raise the job's known owner to this claim when it outranks the one known (the higher
# epoch, then the greater region: jobs.outranks); a job not in this Redis is left alone. 1 when raised.
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local region = redis.call('HGET', KEYS[1], 'owner_region')
local epoch = tonumber(redis.call('HGET', KEYS[1], 'owner_epoch') or '-1')
local new = tonumber(ARGV[2])
if region and (new < epoch or (new == epoch and ARGV[1] <= region)) then return 0 end
redis.call('HSET', KEYS[1], 'owner_region', ARGV[1], 'owner_epoch', ARGV[2])
return 1
"""


@dataclass(frozen=True, slots=True)
class LineChange:
    """One line's compare-and-set for :meth:`JobStore.settle_many` (fields as in :meth:`JobStore.settle`).
    ``dead_letter``: the line ran out of retry rounds, so its caller also dead-letters the result (the store ignores it)."""

    custom_id: str
    expected: str
    new: str
    result: wire.FinalResult | None = None
    retry_due_ms: int | None = None
    counters: Mapping[str, int] = field(default_factory=dict)
    dead_letter: bool = False


class JobStore:
    """Files, jobs and ledgers in one Redis. Methods raise redis errors as they come."""

    def __init__(self, redis: Redis, log: JobLog | None = None) -> None:
        self.redis = redis
        self.log = log
        self._claim = redis.register_script(_CLAIM)
        self._settle = redis.register_script(_SETTLE)
        self._cas_line = redis.register_script(_CAS_LINE)
        self._unqueue_retry = redis.register_script(_UNQUEUE_RETRY)
        self._move_status = redis.register_script(_MOVE_STATUS)
        self._lease = redis.register_script(_LEASE)
        self._release = redis.register_script(_RELEASE)
        self._reserve_storage = redis.register_script(_RESERVE_STORAGE)
        self._delete_file = redis.register_script(_DELETE_FILE)
        self._release_result_bytes = redis.register_script(_RELEASE_RESULT_BYTES)

    # --- files ----------------------------------------------------------------------------------------------------

    async def put_file(self, record: FileRecord) -> None:
        """Store the record, list it for its tenant, and schedule its expiry sweep (when it expires)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            self._put_file(pipe, record)
            await pipe.execute()

    def _put_file(self, pipe, record: FileRecord) -> None:
        pipe.set(constants.file_key(record.id), _json(record))
        pipe.zadd(constants.tenant_files_key(record.tenant_id), {_file_member(record): 0})
        if record.expires_at is not None:
            pipe.zadd(constants.FILE_EXPIRY_KEY, {record.id: record.expires_at})

    async def get_file(self, file_id: str) -> FileRecord | None:
        data = await self.redis.get(constants.file_key(file_id))
        return msgspec.json.decode(data, type=FileRecord) if data else None

    async def delete_file(self, record: FileRecord) -> None:
        """Forget the record (the caller deletes the stored object); an upload's bytes leave its tenant's storage."""
        stored = record.bytes if record.kind == "input" else 0
        keys = [
            constants.file_key(record.id),
            constants.tenant_files_key(record.tenant_id),
            constants.FILE_EXPIRY_KEY,
            constants.tenant_storage_key(record.tenant_id),
        ]
        await self._delete_file(keys=keys, args=[_file_member(record), record.id, stored])

    async def reserve_storage(self, tenant_id: str, size: int, quota: int) -> int | None:
        """Count ``size`` more bytes against the tenant's storage ``quota``; the bytes in use before, or None (and
        nothing counted) when they do not fit."""
        used = await self._reserve_storage(keys=[constants.tenant_storage_key(tenant_id)], args=[size, quota])
        return None if used < 0 else used

    async def release_storage(self, tenant_id: str, size: int) -> None:
        """Give back bytes reserved for an upload that was not kept."""
        await self.redis.decrby(constants.tenant_storage_key(tenant_id), size)

    async def reserve_result_bytes(self, tenant_id: str, size: int, bound: int) -> int | None:
        """Count a new job's ``size`` result bytes against its tenant's ``bound``; the bytes reserved before, or None
        (and nothing counted) when they do not fit. :meth:`create_job` hands the reservation to the job."""
        used = await self._reserve_storage(keys=[constants.tenant_result_bytes_key(tenant_id)], args=[size, bound])
        return None if used < 0 else used

    async def unreserve_result_bytes(self, tenant_id: str, size: int) -> None:
        """Give back a reservation whose job was not created."""
        await self.redis.decrby(constants.tenant_result_bytes_key(tenant_id), size)

    async def stored_bytes(self, tenant_id: str) -> int:
        return int(await self.redis.get(constants.tenant_storage_key(tenant_id)) or 0)

    async def list_files(self, tenant_id: str, after: FileRecord | None, limit: int) -> tuple[list[FileRecord], bool]:
        """A tenant's files, newest first, starting after ``after``; returns (at most ``limit`` files, has_more)."""
        top = "+" if after is None else "(" + _file_member(after)
        members = await self.redis.zrevrangebylex(constants.tenant_files_key(tenant_id), top, "-", 0, limit + 1)
        ids = [m.decode().split(":", 1)[1] for m in members]
        records = await self.redis.mget([constants.file_key(i) for i in ids[:limit]]) if ids else []
        return [msgspec.json.decode(r, type=FileRecord) for r in records if r], len(ids) > limit

    async def expired_files(self, now_s: int, limit: int = 100) -> list[str]:
        """Ids of files whose ``expires_at`` has passed."""
        return [m.decode() for m in await self.redis.zrangebyscore(constants.FILE_EXPIRY_KEY, 0, now_s, 0, limit)]

    # --- jobs -----------------------------------------------------------------------------------------------------

    async def create_job(
        self,
        spec: JobSpec,
        status: str,
        times: Mapping[str, int],
        *,
        files: Iterable[FileRecord],
        lines: Mapping[str, str] = {},
        offsets: Mapping[str, str] = {},
        results: Mapping[str, wire.FinalResult] = {},
        errors: Iterable[LineError] = (),
        errored: int = 0,
        owner: JobOwner | None = None,
    ) -> None:
        """Write a new job in one transaction: its hash, ledger lines (custom_id -> state), prepared-file offsets,
        results settled already (lines that failed validation: counted as errored, with ``errored`` more written by
        :meth:`add_lines`), its output/error file records, its tenant listing entry, and (when it is ``in_progress``)
        its place among the jobs the routers drive. ``owner``: the creating region's claim (epoch 0). The job log gets
        the claim and the job's record first."""
        errors = list(errors)
        if self.log is not None:
            if owner is not None:
                await self.log.put_owner(owner)
            await self.log.put_record(JobRecord(spec=spec, status=status, times=dict(times), errors=errors))
        job = {
            "spec": _json(spec),
            "status": status,
            "cursor": 0,
            "errors": _json(errors),
            **{f"at:{name}": at for name, at in times.items()},
            **{name: 0 for name in jobs.COUNTERS},
            jobs.STATE_COUNTER[jobs.ERRORED]: len(results) + errored,
            **_owner_fields(owner),
        }
        if spec.result_bytes and status in jobs.ACTIVE_STATUSES:
            job["result_bytes"] = spec.result_bytes  # the reservation: released with the ledger (retire)
        async with self.redis.pipeline(transaction=True) as pipe:
            self._put_job(pipe, spec, job, status, files=files, lines=lines, offsets=offsets, results=results)
            await pipe.execute()

    async def add_lines(
        self,
        batch_id: str,
        lines: Mapping[str, str],
        offsets: Mapping[str, str],
        results: Mapping[str, wire.FinalResult],
        requests: Mapping[str, bytes] = {},
    ) -> None:
        """Write a slice of a job's ledger before the job itself exists (create_job makes it visible), so a large
        input never sits in the API pod whole; :meth:`discard_ledger` drops it when the job is not created.
        ``requests``: the runnable lines' prepared requests, for the job log (with the rejected lines' results)."""
        if self.log is not None:
            await self.log.put_lines(batch_id, requests)
            await self.log.put_results(batch_id, results)
        async with self.redis.pipeline(transaction=False) as pipe:
            if lines:
                pipe.hset(constants.job_lines_key(batch_id), mapping=dict(lines))
            if offsets:
                pipe.hset(constants.job_offsets_key(batch_id), mapping=dict(offsets))
            if results:
                pipe.hset(constants.job_results_key(batch_id), mapping={k: wire.encode(v) for k, v in results.items()})
            await pipe.execute()

    async def discard_ledger(self, batch_id: str) -> None:
        await self.redis.delete(
            constants.job_lines_key(batch_id), constants.job_offsets_key(batch_id), constants.job_results_key(batch_id)
        )

    async def claim_batch_key(self, tenant_id: str, key: str, batch_id: str, ttl_s: int) -> str | None:
        """Claim an ``Idempotency-Key`` for ``batch_id``; returns the batch id that claimed it earlier, or None."""
        redis_key = constants.batch_idempotency_key(tenant_id, key)
        if await self.redis.set(redis_key, batch_id, nx=True, ex=ttl_s):
            return None
        earlier = await self.redis.get(redis_key)
        return earlier.decode() if earlier else None

    async def release_batch_key(self, tenant_id: str, key: str) -> None:
        await self.redis.delete(constants.batch_idempotency_key(tenant_id, key))

    async def get_job(self, batch_id: str) -> JobView | None:
        return _view(await self.redis.hgetall(constants.job_key(batch_id)))

    async def job_tenant(self, batch_id: str) -> str | None:
        """The tenant a job was created for (fixed for its life); None when there is no such job."""
        spec = await self.redis.hget(constants.job_key(batch_id), "spec")
        return msgspec.json.decode(spec, type=JobSpec).tenant_id if spec else None

    async def list_jobs(self, tenant_id: str, after: JobView | None, limit: int) -> tuple[list[JobView], bool]:
        """A tenant's jobs, newest first, starting after ``after``; returns (jobs, has_more)."""
        top = "+" if after is None else "(" + jobs.listing_member(after.spec.created_ms, after.spec.id)
        members = await self.redis.zrevrangebylex(constants.tenant_jobs_key(tenant_id), top, "-", 0, limit + 1)
        ids = [m.decode().split(":", 1)[1] for m in members]
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids[:limit]:
                pipe.hgetall(constants.job_key(batch_id))
            views = [_view(h) for h in await pipe.execute()]
        return [v for v in views if v is not None], len(ids) > limit

    async def move_status(
        self, batch_id: str, allowed: Iterable[str], status: str, at_s: int, end_ms: int | None = None
    ) -> bool:
        """Compare-and-set the job's status: only from one of ``allowed``. Records ``at:<status>``; ``end_ms`` marks
        when a cancel or the window's end began. Entering a terminal status leaves the driven set."""
        moved = bool(
            await self._move_status(
                keys=[constants.job_key(batch_id)],
                args=[",".join(allowed), status, at_s, "" if end_ms is None else end_ms],
            )
        )
        if moved and status in jobs.TERMINAL_STATUSES:
            await self.redis.srem(constants.ACTIVE_JOBS_KEY, batch_id)
        if moved and self.log is not None and (job := await self.get_job(batch_id)) is not None:
            await self.log.put_record(
                JobRecord(spec=job.spec, status=job.status, times=job.times, end_ms=job.end_ms, errors=job.errors)
            )
        return moved

    async def active_jobs(self) -> list[str]:
        return [m.decode() for m in await self.redis.smembers(constants.ACTIVE_JOBS_KEY)]

    # --- the ledger -----------------------------------------------------------------------------------------------

    async def line_states(self, batch_id: str, custom_ids: list[str]) -> list[str | None]:
        values = await self.redis.hmget(constants.job_lines_key(batch_id), custom_ids) if custom_ids else []
        return [v.decode() if v else None for v in values]

    async def scan_lines(self, batch_id: str) -> AsyncIterator[tuple[str, str]]:
        """Every (custom_id, state) of the job, in no order."""
        async for custom_id, state in self.redis.hscan_iter(constants.job_lines_key(batch_id), count=1000):
            yield custom_id.decode(), state.decode()

    async def settle(
        self,
        batch_id: str,
        custom_id: str,
        expected: str,
        new: str,
        *,
        result: wire.FinalResult | None = None,
        retry_due_ms: int | None = None,
        counters: Mapping[str, int] = {},
    ) -> bool:
        """Move a line from ``expected`` to ``new`` with its result and counters, atomically; False (and no change)
        when the line is not in ``expected`` (already settled, a stale round, unknown). ``retry_due_ms`` queues it
        for a retry round; otherwise it leaves the retry queue."""
        return (
            await self.settle_many(batch_id, [LineChange(custom_id, expected, new, result, retry_due_ms, counters)])
            == 1
        )

    async def settle_many(self, batch_id: str, changes: Iterable[LineChange]) -> int:
        """:meth:`settle` for many lines in one round trip (each line atomically); returns how many applied. The
        terminal results go to the job log first (a line a race settled otherwise keeps its Redis result here, and the
        rebuild takes the one logged last: either way one result per line)."""
        changes = list(changes)
        if self.log is not None:
            await self.log.put_results(
                batch_id,
                {c.custom_id: c.result for c in changes if c.result is not None and c.new in jobs.TERMINAL_LINE_STATES},
            )
        async with self.redis.pipeline(transaction=False) as pipe:
            for c in changes:
                keys, args = self._settle_call(
                    batch_id, c.custom_id, c.expected, c.new, c.result, c.retry_due_ms, c.counters
                )
                await self._settle(keys=keys, args=args, client=pipe)
            return sum(await pipe.execute())

    @staticmethod
    def _settle_call(
        batch_id: str,
        custom_id: str,
        expected: str,
        new: str,
        result: wire.FinalResult | None,
        retry_due_ms: int | None,
        counters: Mapping[str, int],
    ) -> tuple[list[str], list]:
        args = [
            custom_id,
            expected,
            new,
            wire.encode(result) if result is not None else b"",
            "" if retry_due_ms is None else retry_due_ms,
        ]
        for name, increment in counters.items():
            args += [name, increment]
        keys = [
            constants.job_lines_key(batch_id),
            constants.job_results_key(batch_id),
            constants.job_key(batch_id),
            constants.job_retries_key(batch_id),
        ]
        return keys, args

    async def cas_line(self, batch_id: str, custom_id: str, expected: str, new: str) -> bool:
        return bool(await self._cas_line(keys=[constants.job_lines_key(batch_id)], args=[custom_id, expected, new]))

    async def due_retries(self, batch_id: str, now_ms: int, limit: int) -> list[str]:
        members = await self.redis.zrangebyscore(constants.job_retries_key(batch_id), 0, now_ms, 0, limit)
        return [m.decode() for m in members]

    async def waiting_retries(self, batch_id: str) -> int:
        return await self.redis.zcard(constants.job_retries_key(batch_id))

    async def unqueue_retry(self, batch_id: str, custom_id: str, state: str) -> None:
        """The retry round ``state`` of the line is produced: drop it from the retry queue unless it moved on."""
        await self._unqueue_retry(
            keys=[constants.job_lines_key(batch_id), constants.job_retries_key(batch_id)], args=[custom_id, state]
        )

    async def offsets(self, batch_id: str, custom_ids: list[str]) -> list[tuple[int, int] | None]:
        """Each line's ``(start, end)`` bytes in the prepared file."""
        values = await self.redis.hmget(constants.job_offsets_key(batch_id), custom_ids) if custom_ids else []
        return [tuple(int(x) for x in v.split(b":")) if v else None for v in values]

    async def set_cursor(self, batch_id: str, cursor: int, produced: int) -> None:
        """Round 0 is produced up to byte ``cursor`` of the prepared file; ``produced`` more lines went out."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(constants.job_key(batch_id), "cursor", cursor)
            pipe.hincrby(constants.job_key(batch_id), "produced", produced)
            await pipe.execute()

    async def scan_results(self, batch_id: str) -> AsyncIterator[wire.FinalResult]:
        """The settled results of the job (partial while it runs), in no order."""
        async for _, data in self.redis.hscan_iter(constants.job_results_key(batch_id), count=500):
            yield wire.decode(data)

    async def retire(self, batch_id: str, until_s: int) -> None:
        """After the results file is written: drop the ledger, keep the job's hash until epoch s ``until_s`` (then
        :meth:`delete_job`; the hash serves the output files, so it gets no TTL an eviction policy could act on).
        The job's result-bytes reservation goes back to its tenant; its input lines leave the job log (tombstones:
        compaction drops them; an ended job is served from its results)."""
        if self.log is not None:
            custom_ids = [c.decode() for c in await self.redis.hkeys(constants.job_offsets_key(batch_id))]
            await self.log.drop_lines(batch_id, custom_ids)
        job = await self.get_job(batch_id)
        if job is not None:
            await self._release_result_bytes(
                keys=[constants.job_key(batch_id), constants.tenant_result_bytes_key(job.spec.tenant_id)]
            )
        await self.redis.delete(
            constants.job_lines_key(batch_id),
            constants.job_offsets_key(batch_id),
            constants.job_results_key(batch_id),
            constants.job_retries_key(batch_id),
        )
        await self.redis.zadd(constants.JOB_EXPIRY_KEY, {batch_id: until_s})

    async def expired_jobs(self, now_s: int, limit: int = 100) -> list[str]:
        """Ids of ended jobs whose retention has passed."""
        return [m.decode() for m in await self.redis.zrangebyscore(constants.JOB_EXPIRY_KEY, 0, now_s, 0, limit)]

    async def delete_job(self, batch_id: str) -> None:
        """Forget an ended job: its hash, its tenant listing entry, its expiry entry."""
        job = await self.get_job(batch_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(constants.job_key(batch_id))
            if job is not None:
                pipe.zrem(
                    constants.tenant_jobs_key(job.spec.tenant_id), jobs.listing_member(job.spec.created_ms, batch_id)
                )
            pipe.zrem(constants.JOB_EXPIRY_KEY, batch_id)
            await pipe.execute()

    # --- leases ---------------------------------------------------------------------------------------------------

    async def hold_lease(self, batch_id: str, token: str, ttl_ms: int) -> bool:
        """Take the job's lease (free) or extend it (ours); False when another router holds it."""
        return bool(await self._lease(keys=[constants.job_lease_key(batch_id)], args=[token, ttl_ms]))

    async def release_lease(self, batch_id: str, token: str) -> None:
        await self._release(keys=[constants.job_lease_key(batch_id)], args=[token])

    # --- owners (fencing) and the view's rebuild ------------------------------------------------------------------

    async def owner(self, batch_id: str) -> str | None:
        """The region of the highest claim on the job known here; None when none is recorded (a job created before
        claims existed: it is this region's)."""
        region = await self.redis.hget(constants.job_key(batch_id), "owner_region")
        return region.decode() if region else None

    async def raise_owner(self, claim: JobOwner) -> bool:
        """Record ``claim`` as the job's owner if it outranks the one known (the job must be in this Redis)."""
        return bool(await self._claim(keys=[constants.job_key(claim.batch_id)], args=[claim.region, claim.epoch]))

    async def restore_job(
        self,
        record: JobRecord,
        owner: JobOwner | None,
        *,
        files: Iterable[FileRecord],
        lines: Mapping[str, str] = {},
        offsets: Mapping[str, str] = {},
        results: Mapping[str, wire.FinalResult] = {},
    ) -> None:
        """Replace this Redis' view of a job with one rebuilt from the job log, in one transaction: the hash (counters
        from ``results``; round 0 starts again from the prepared file's first byte, skipping lines settled already),
        the ledger (lines, offsets, results: an active job's), the output/error file records, the tenant listing
        entry, its place among the driven jobs."""
        spec = record.spec
        counts = jobs.result_counts(results.values())
        job = {
            "spec": _json(spec),
            "status": record.status,
            "cursor": 0,
            "errors": _json(record.errors),
            "end_ms": record.end_ms,
            **{f"at:{name}": at for name, at in record.times.items()},
            **{name: counts.get(name, 0) for name in jobs.COUNTERS},
            **_owner_fields(owner),
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(constants.job_key(spec.id), *(k(spec.id) for k in _LEDGER_KEYS))
            self._put_job(pipe, spec, job, record.status, files=files, lines=lines, offsets=offsets, results=results)
            await pipe.execute()

    def _put_job(
        self,
        pipe,
        spec: JobSpec,
        job: Mapping[str, object],
        status: str,
        *,
        files: Iterable[FileRecord],
        lines: Mapping[str, str],
        offsets: Mapping[str, str],
        results: Mapping[str, wire.FinalResult],
    ) -> None:
        """Queue on ``pipe`` the writes of a job's whole view: its hash, ledger, file records, tenant listing entry and
        its place among the driven jobs (in it exactly when ``status`` is active)."""
        pipe.hset(constants.job_key(spec.id), mapping=job)
        if lines:
            pipe.hset(constants.job_lines_key(spec.id), mapping=dict(lines))
        if offsets:
            pipe.hset(constants.job_offsets_key(spec.id), mapping=dict(offsets))
        if results:
            pipe.hset(constants.job_results_key(spec.id), mapping={k: wire.encode(v) for k, v in results.items()})
        for record in files:
            self._put_file(pipe, record)
        pipe.zadd(constants.tenant_jobs_key(spec.tenant_id), {jobs.listing_member(spec.created_ms, spec.id): 0})
        if status in jobs.ACTIVE_STATUSES:
            pipe.sadd(constants.ACTIVE_JOBS_KEY, spec.id)
        else:
            pipe.srem(constants.ACTIVE_JOBS_KEY, spec.id)


_LEDGER_KEYS = (
    constants.job_lines_key,
    constants.job_offsets_key,
    constants.job_results_key,
    constants.job_retries_key,
)


def _owner_fields(owner: JobOwner | None) -> dict[str, str | int]:
    return {} if owner is None else {"owner_region": owner.region, "owner_epoch": owner.epoch}


def _file_member(record: FileRecord) -> str:
    return jobs.listing_member(record.created_at * 1000, record.id)


def _view(fields: Mapping[bytes, bytes]) -> JobView | None:
    """Decode a job hash (None when it does not exist)."""
    if not fields:
        return None
    text = {k.decode(): v for k, v in fields.items()}
    times = {k[3:]: int(v) for k, v in text.items() if k.startswith("at:")}
    counts = {name: int(text.get(name, 0)) for name in jobs.COUNTERS}
    return JobView(
        spec=msgspec.json.decode(text["spec"], type=JobSpec),
        status=text["status"].decode(),
        times=times,
        counts=counts,
        errors=msgspec.json.decode(text.get("errors", b"[]"), type=list[LineError]),
        cursor=int(text.get("cursor", 0)),
        end_ms=int(text.get("end_ms", 0)),
    )

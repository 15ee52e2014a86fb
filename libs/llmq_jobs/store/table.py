"""Jobs in Redis: each job's hash (spec, status, times, counters, owner), its tenant's listing, the set of jobs the
result-routers drive, idempotency keys, and the ended jobs' expiry. Key names: :mod:`llmq_core.constants`.

With a :class:`~llmq_jobs.joblog.JobLog` (every service's store has one; tests of pure Redis behaviour may go
without), Redis is a view of the job topics: a job and its claim are written to Kafka before Redis, a status move
right after it applied, and :meth:`JobTable.restore_job` rebuilds the view from the topics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
from redis.asyncio import Redis

from llmq_core import constants, wire
from llmq_core.constants import ANTHROPIC, OPENAI
from llmq_jobs import jobs
from llmq_jobs.joblog import JobLog
from llmq_jobs.jobs import FileRecord, JobOwner, JobRecord, JobSpec, JobView, LineError
from llmq_jobs.store.fencing import owner_fields
from llmq_jobs.store.files import put_file_on
from llmq_jobs.store.ledger import LEDGER_KEYS, put_ledger_on
from llmq_jobs.store.quotas import Quotas

_json = msgspec.json.encode

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


# KEYS: job, lines, results. ARGV: terminal statuses (comma-separated), replace ('1': the triples are the whole
# ledger, every other line reads pending round 0), status ('' keeps it), end_ms, then n and n (name, value) pairs of
# hash fields (times and counters), then (custom_id, state, result ('' drops it)) triples. A job not here, or ended
# here, is left alone (0): an ended view is final, and a late writer must not bring its ledger back.
_MIRROR_VIEW = """
local now = redis.call('HGET', KEYS[1], 'status')
if not now then return 0 end
for status in string.gmatch(ARGV[1], '[^,]+') do if status == now then return 0 end end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'status', ARGV[3], 'end_ms', ARGV[4]) end
local n = tonumber(ARGV[5])
for i = 6, 5 + 2 * n, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local given = {}
for i = 6 + 2 * n, #ARGV, 3 do
  given[ARGV[i]] = true
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] == '' then redis.call('HDEL', KEYS[3], ARGV[i]) else redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 2]) end
end
if ARGV[2] == '1' then
  for _, custom_id in ipairs(redis.call('HKEYS', KEYS[2])) do
    if not given[custom_id] then
      redis.call('HSET', KEYS[2], custom_id, 'p0')
      redis.call('HDEL', KEYS[3], custom_id)
    end
  end
end
return 1
"""


class JobTable:
    """The jobs' records and their life: create, read, list, move status, retire, delete, restore. ``quotas``: the
    tenants' result-byte counters a retired job gives its reservation back to. Methods raise redis errors as they
    come."""

    def __init__(self, redis: Redis, log: JobLog | None, quotas: Quotas) -> None:
        self.redis = redis
        self.log = log
        self.quotas = quotas
        self._move_status = redis.register_script(_MOVE_STATUS)
        self._mirror_view = redis.register_script(_MIRROR_VIEW)

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
        ``Ledger.add_lines``), its output/error file records, its tenant listing entry, and (when it is
        ``in_progress``) its place among the jobs the routers drive. ``owner``: the creating region's claim (epoch 0),
        for the fencing view; the job log gets the job's record first (the claim is the job's id: jobs.creation_claim)."""
        errors = list(errors)
        if self.log is not None:
            await self.log.put_record(JobRecord(spec=spec, status=status, times=dict(times), errors=errors))
        job = {
            "spec": _json(spec),
            "status": status,
            "cursor": 0,
            "errors": _json(errors),
            **{f"at:{name}": at for name, at in times.items()},
            **{name: 0 for name in jobs.COUNTERS},
            jobs.STATE_COUNTER[jobs.ERRORED]: len(results) + errored,
            **owner_fields(owner),
        }
        if spec.result_bytes and status in jobs.ACTIVE_STATUSES:
            job["result_bytes"] = spec.result_bytes  # the reservation: released with the ledger (retire)
        async with self.redis.pipeline(transaction=True) as pipe:
            _put_job(pipe, spec, job, status, files=files, lines=lines, offsets=offsets, results=results)
            await pipe.execute()

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

    async def list_jobs(
        self, tenant_id: str, after: JobView | None, limit: int, api_format: str = OPENAI, before: JobView | None = None
    ) -> tuple[list[JobView], bool]:
        """A tenant's jobs created through ``api_format``'s API, newest first: those older than ``after``, or (given
        ``before``) the ``limit`` just newer than it; returns (jobs, has_more: more lie past the page's far end)."""
        key = _listing_key(tenant_id, api_format)
        if before is not None:
            bottom = "(" + jobs.listing_member(before.spec.created_ms, before.spec.id)
            members = (await self.redis.zrangebylex(key, bottom, "+", 0, limit + 1))[::-1]
            more, members = len(members) > limit, members[-limit:]
        else:
            top = "+" if after is None else "(" + jobs.listing_member(after.spec.created_ms, after.spec.id)
            members = await self.redis.zrevrangebylex(key, top, "-", 0, limit + 1)
            more, members = len(members) > limit, members[:limit]
        ids = [m.decode().split(":", 1)[1] for m in members]
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hgetall(constants.job_key(batch_id))
            views = [_view(h) for h in await pipe.execute()]
        return [v for v in views if v is not None], more

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

    async def mirror_view(
        self,
        batch_id: str,
        record: JobRecord | None,
        counts: Mapping[str, int],
        results: Mapping[str, wire.FinalResult | None],
        *,
        replace: bool = False,
    ) -> bool:
        """Show here a job that another region drives now, as that region's job topics have it: ``record`` its latest
        record (status, times, end; None: none mirrored yet, or an ended one, which :func:`llmq_jobs.regions.restore`
        writes once its ledger is complete), ``counts`` its counters (:func:`jobs.result_counts` of its ledger),
        ``results`` the lines' results that changed (None: not settled there); ``replace``: ``results`` is its whole
        ledger, so every other line reads pending. Not logged (this region's job topics keep what it did itself), and
        the driven set is left alone. False (nothing written) for a job not here or ended here."""
        args: list = [",".join(sorted(jobs.TERMINAL_STATUSES)), "1" if replace else "0"]
        args += ["", ""] if record is None else [record.status, record.end_ms]
        fields = {name: counts.get(name, 0) for name in jobs.COUNTERS if name != "produced"}
        if record is not None:
            fields |= {f"at:{name}": at for name, at in record.times.items()}
        args.append(len(fields))
        for name, value in fields.items():
            args += [name, value]
        for custom_id, result in results.items():
            state = jobs.pending(0) if result is None else jobs.OUTCOME_STATE[result.outcome]
            args += [custom_id, state, b"" if result is None else wire.encode(result)]
        keys = [constants.job_key(batch_id), constants.job_lines_key(batch_id), constants.job_results_key(batch_id)]
        return bool(await self._mirror_view(keys=keys, args=args))

    async def active_jobs(self) -> list[str]:
        return [m.decode() for m in await self.redis.smembers(constants.ACTIVE_JOBS_KEY)]

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
            await self.quotas.release_job_result_bytes(batch_id, job.spec.tenant_id)
        await self.redis.delete(*(key(batch_id) for key in LEDGER_KEYS))
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
                    _listing_key(job.spec.tenant_id, job.spec.api_format),
                    jobs.listing_member(job.spec.created_ms, batch_id),
                )
            pipe.zrem(constants.JOB_EXPIRY_KEY, batch_id)
            await pipe.execute()

    async def restore_job(
        self,
        record: JobRecord,
        owner: JobOwner | None,
        *,
        files: Iterable[FileRecord],
        results: Mapping[str, wire.FinalResult],
        lines: Mapping[str, str] = {},
        offsets: Mapping[str, str] = {},
        until_s: int | None = None,
    ) -> None:
        """Replace this Redis' view of a job with one rebuilt from the job log, in one transaction: the hash (its
        counters and usage from ``results``, every line's logged result: :func:`jobs.result_counts`; round 0 starts
        again from the prepared file's first byte, skipping lines settled already), an active job's ledger (lines,
        offsets, results; an ended job's was retired into its results file), the output/error file records, the
        tenant listing entry, its place among the driven jobs, and an ended job's expiry at epoch s ``until_s``."""
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
            **owner_fields(owner),
        }
        ledger = results if record.status in jobs.ACTIVE_STATUSES else {}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(constants.job_key(spec.id), *(key(spec.id) for key in LEDGER_KEYS))
            _put_job(pipe, spec, job, record.status, files=files, lines=lines, offsets=offsets, results=ledger)
            if until_s is None:
                pipe.zrem(constants.JOB_EXPIRY_KEY, spec.id)
            else:
                pipe.zadd(constants.JOB_EXPIRY_KEY, {spec.id: until_s})
            await pipe.execute()


def _put_job(
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
    put_ledger_on(pipe, spec.id, lines, offsets, results)
    for record in files:
        put_file_on(pipe, record)
    pipe.zadd(_listing_key(spec.tenant_id, spec.api_format), {jobs.listing_member(spec.created_ms, spec.id): 0})
    if status in jobs.ACTIVE_STATUSES:
        pipe.sadd(constants.ACTIVE_JOBS_KEY, spec.id)
    else:
        pipe.srem(constants.ACTIVE_JOBS_KEY, spec.id)


def _listing_key(tenant_id: str, api_format: str) -> str:
    """The tenant's listing of the jobs created through one API: ``/v1/batches`` or ``/v1/messages/batches``."""
    if api_format == ANTHROPIC:
        return constants.tenant_message_batches_key(tenant_id)
    return constants.tenant_jobs_key(tenant_id)


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
        owner_region=text.get("owner_region", b"").decode(),
    )

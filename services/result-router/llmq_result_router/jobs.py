"""Batch jobs in the result-router: the ledger side (settle each line's result) and the driver (produce lines, retry,
wind down, finalize).

Why here and not in the API pod: a job outlives the request that created it. The API pod validates the input file,
writes the job and its ledger to Redis and returns; from then on the job is driven by whichever result-router holds
its lease (a Redis key refreshed every tick), so an API pod crash loses nothing and a result-router crash only
pauses the job until the lease lapses and another router (or the restarted one) takes over. Every step is
idempotent: lines are produced with request ids derived from batch id + custom_id (+ round), the round-0 cursor is
saved after its lines are acknowledged by Kafka, and every ledger change is a compare-and-set keyed by custom_id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from llmq_core import constants, kafka, wire
from llmq_core.clock import Clock
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.filestore import FileStore
from llmq_jobs.jobs import JobView
from llmq_jobs.store import JobStore, LineChange
from llmq_result_router import jobpolicy
from llmq_result_router.jobpolicy import Plan, Step
from llmq_result_router.owners import OwnerWatcher

log = logging.getLogger(__name__)

CANCEL_REASON = "batch_cancelled"
PRODUCE_CHUNK = 256  # lines produced (and acknowledged) per step
SETTLE_CHUNK = 1000  # ledger writes per Redis round trip
SWEEP_INTERVAL_MS = 60_000
TENANTS_CACHED = 10_000  # jobs whose tenant a ledger remembers (a job's tenant never changes)
LEDGER_RETRY_FIRST_S, LEDGER_RETRY_MAX_S = 0.1, 5.0  # backoff while Redis refuses a ledger write
_json = msgspec.json.encode


@dataclass(eq=False, repr=False)
class JobLedger:
    """Settles the result of one batch-job line (a FinalResult whose ``reply_to`` is a JobReply)."""

    settings: Settings
    store: JobStore
    producer: AIOKafkaProducer
    clock: Clock
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    _tenants: dict[str, str] = field(init=False, default_factory=dict)  # batch id -> its tenant

    async def forgery(self, result: wire.FinalResult) -> str | None:
        """Why ``result`` (a JobReply one) is not a line result llmq dispatched; None when it may be (see
        :func:`jobpolicy.forgery`)."""
        batch_id = result.reply_to.batch_id
        tenant = self._tenants.get(batch_id)
        if tenant is None:
            tenant = await self.store.jobs.job_tenant(batch_id)
            if tenant is not None:
                if len(self._tenants) >= TENANTS_CACHED:
                    self._tenants.clear()
                self._tenants[batch_id] = tenant
        return jobpolicy.forgery(result, tenant)

    async def on_result(self, result: wire.FinalResult) -> None:
        """Apply ``result`` to its line (at most once, whatever the redeliveries). A line out of retry rounds is also
        produced to the dead-letter topic first (at least once)."""
        reply = result.reply_to
        if not await _owned(self.store, reply.batch_id, self.settings.region.name):
            return  # another region took the job over (fencing): its ledger settles the line
        [state] = await self.store.ledger.line_states(reply.batch_id, [reply.custom_id])
        change = jobpolicy.settle_result(
            result,
            state,
            max_rounds=self.settings.jobs.batch_max_rounds,
            backoff_ms=self.settings.jobs.batch_retry_backoff_ms,
            now_ms=self.clock.now_ms(),
        )
        if change is None:
            return
        if change.dead_letter:
            reason = f"batch {reply.batch_id} line {reply.custom_id}: still failing after its last retry round"
            letter = kafka.Letter(wire.encode(result), result.request_id.encode(), kafka.headers())
            await kafka.dead_letter(self.producer, letter, reason)
        await self._settle(reply.batch_id, change)

    async def _settle(self, batch_id: str, change: LineChange) -> None:
        """Write the line's change, retrying with backoff while Redis refuses it (maxmemory full of state without a
        TTL): the ledger is the job's only record of the line, and the result's offset is committed only after it."""
        delay_s = LEDGER_RETRY_FIRST_S
        while True:
            try:
                await self.store.ledger.settle_many(batch_id, [change])
                return
            except ResponseError as exc:
                log.warning(
                    "ledger write of batch %s line %s refused (%s); again in %.1f s",
                    batch_id,
                    change.custom_id,
                    exc,
                    delay_s,
                    extra={"batch_id": batch_id},
                )
            await self.sleep(delay_s)
            delay_s = min(2 * delay_s, LEDGER_RETRY_MAX_S)


@dataclass(eq=False, repr=False)
class JobDriver:
    """Drives every active job whose lease this router holds, one step per tick."""

    settings: Settings
    store: JobStore
    files: FileStore
    producer: AIOKafkaProducer
    redis: Redis
    clock: Clock
    owners: OwnerWatcher | None = None  # fencing across regions: no job is driven before its claims were read
    holder: str = ""  # this router's instance id: the lease's value names who drives a job (operators, tests)
    token: str = field(init=False, default="")  # ``<holder>/<random>``: unique to this process's life
    _wound_down: set[str] = field(init=False, default_factory=set)  # jobs whose not-running lines it already ended
    _held: set[str] = field(init=False, default_factory=set)  # jobs whose lease this driver holds
    _last_sweep_ms: int = field(init=False, default=0)
    _stopping: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.token = f"{self.holder}/{secrets.token_hex(8)}"

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Tick until stopped, then hand the leases back; a failing job or Redis hiccup is logged and retried next
        tick."""
        while not self._stopping.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("job driver tick failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), self.settings.jobs.batch_tick_ms / 1000)
            except TimeoutError:
                pass
        with contextlib.suppress(Exception):  # Redis gone: the leases simply lapse
            for batch_id in self._held:
                await self.store.leases.release_lease(batch_id, self.token)

    async def tick(self) -> None:
        if self.owners is not None and not self.owners.caught_up.is_set():
            return
        active = await self.store.jobs.active_jobs()
        self._held &= set(active)
        for batch_id in active:
            await self.step(batch_id)
        now_ms = self.clock.now_ms()
        if now_ms - self._last_sweep_ms >= SWEEP_INTERVAL_MS:
            self._last_sweep_ms = now_ms
            await self.sweep_files(now_ms // 1000)

    async def step(self, batch_id: str) -> None:
        """Drive one job if its lease is ours (taking a free one); a job that fails is handed over."""
        if not await self.store.leases.hold_lease(batch_id, self.token, self.settings.jobs.batch_lease_ms):
            self._held.discard(batch_id)
            return
        self._held.add(batch_id)
        try:
            await self.drive(batch_id)
        except Exception:
            # Hand the job over: another router (say, one that can read the file store) may do better.
            log.exception("driving batch %s failed; releasing it", batch_id, extra={"batch_id": batch_id})
            self._held.discard(batch_id)
            await self.store.leases.release_lease(batch_id, self.token)

    async def drive(self, batch_id: str) -> None:
        """One step of one job (see :func:`jobpolicy.plan_job`), unless another region's claim outranks ours (checked
        before every step: a takeover fences this region off from its next step on)."""
        job = await self.store.jobs.get_job(batch_id)
        if job is None:
            await self.redis.srem(constants.ACTIVE_JOBS_KEY, batch_id)
            return
        if not await _owned(self.store, batch_id, self.settings.region.name):
            log.info("batch %s is driven by another region now; leaving it", batch_id, extra={"batch_id": batch_id})
            await self.redis.srem(constants.ACTIVE_JOBS_KEY, batch_id)
            return
        plan = jobpolicy.plan_job(job, self.clock.now_ms(), self.settings.jobs.batch_end_grace_ms)
        if plan.step is Step.RUN:
            await self._run(job)
        elif plan.step is Step.WIND_DOWN:
            await self._wind_down(job, plan)
        elif plan.step is Step.FORCE_END:
            await self._end_lines(job, plan.outcome, lambda state, start: True)
        elif plan.step is Step.FINALIZE:
            await self._finalize(job, plan)

    # --- running ----------------------------------------------------------------------------------------------------

    async def _run(self, job: JobView) -> None:
        batch_id = job.spec.id
        waiting = await self.store.ledger.waiting_retries(batch_id)
        room = self.settings.jobs.batch_in_flight_lines - jobpolicy.in_flight(job, waiting)
        if room <= 0:
            return
        room -= await self._produce_retries(job, min(room, PRODUCE_CHUNK))
        if room > 0 and job.count("produced") < job.spec.runnable:
            await self._produce_round0(job, min(room, PRODUCE_CHUNK))

    async def _produce_round0(self, job: JobView, limit: int) -> None:
        spec = job.spec
        lines = await self.files.read_lines(spec.prepared_path, job.cursor, limit)
        if not lines:
            return
        requests = [msgspec.json.decode(raw, type=wire.GenerationRequest) for _, raw in lines]
        states = await self.store.ledger.line_states(spec.id, [r.reply_to.custom_id for r in requests])
        now_ms = self.clock.now_ms()
        due = [msgspec.structs.replace(r, created_ms=now_ms) for r, s in zip(requests, states) if s == jobs.pending(0)]
        await self._send(due)
        await self.store.ledger.set_cursor(spec.id, lines[-1][0], len(lines))

    async def _produce_retries(self, job: JobView, limit: int) -> int:
        batch_id = job.spec.id
        custom_ids = await self.store.ledger.due_retries(batch_id, self.clock.now_ms(), limit)
        if not custom_ids:
            return 0
        states = await self.store.ledger.line_states(batch_id, custom_ids)
        offsets = await self.store.ledger.offsets(batch_id, custom_ids)
        now_ms = self.clock.now_ms()
        out: list[tuple[str, str, wire.GenerationRequest]] = []
        for custom_id, state, span in zip(custom_ids, states, offsets):
            code, round_ = jobs.parse_state(state or "")
            if code == jobs.RETRY and await self.store.ledger.cas_line(
                batch_id, custom_id, state, jobs.pending(round_)
            ):
                code = jobs.PENDING  # a pending line still queued for retry: produced before a crash, maybe not
            if code != jobs.PENDING or span is None:
                continue
            template = await self.files.read_range(job.spec.prepared_path, span[0], span[1])
            request = msgspec.json.decode(template.rstrip(b"\n"), type=wire.GenerationRequest)
            request = msgspec.structs.replace(
                request, request_id=jobs.line_request_id(batch_id, custom_id, round_), attempt=round_, created_ms=now_ms
            )
            out.append((custom_id, jobs.pending(round_), request))
        await self._send([request for _, _, request in out])
        for custom_id, state, _ in out:
            await self.store.ledger.unqueue_retry(batch_id, custom_id, state)
        return len(out)

    async def _send(self, requests: Iterable[wire.GenerationRequest]) -> None:
        """Produce to the deferred topic and wait for every acknowledgement (raises if any failed)."""
        topic = constants.requests_topic(constants.DEFERRED)
        await asyncio.gather(*(kafka.send_message(self.producer, topic, r, key=r.request_id) for r in requests))

    # --- ending -----------------------------------------------------------------------------------------------------

    async def _wind_down(self, job: JobView, plan: Plan) -> None:
        """Once per job and driver: end the lines that are not running; on a cancel, cancel the running ones."""
        if job.spec.id in self._wound_down:
            return
        cancel = plan.outcome is wire.Outcome.CANCELED
        await self._end_lines(
            job,
            plan.outcome,
            lambda state, start: not jobpolicy.produced(state, start, job.cursor),
            cancel_others=cancel,
        )
        self._wound_down.add(job.spec.id)

    async def _end_lines(self, job: JobView, outcome: wire.Outcome, which, cancel_others: bool = False) -> None:
        """End every unsettled line for which ``which(state, start offset)`` holds as ``outcome``; with
        ``cancel_others``, first publish a Cancel for each of the other (running) lines."""
        batch_id = job.spec.id
        ending, running = [], []
        async for chunk in self._unsettled(batch_id):
            spans = await self.store.ledger.offsets(batch_id, [custom_id for custom_id, _ in chunk])
            for (custom_id, state), span in zip(chunk, spans):
                (ending if which(state, span[0] if span else 0) else running).append((custom_id, state))
        if cancel_others and running:
            await self._publish_cancels(batch_id, running)
        now_ms = self.clock.now_ms()
        for start in range(0, len(ending), SETTLE_CHUNK):
            changes = [
                jobpolicy.end_line(batch_id, custom_id, state, outcome, now_ms)
                for custom_id, state in ending[start : start + SETTLE_CHUNK]
            ]
            await self.store.ledger.settle_many(batch_id, [c for c in changes if c is not None])

    async def _publish_cancels(self, batch_id: str, lines: list[tuple[str, str]]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for custom_id, state in lines:
                request_id = jobs.line_request_id(batch_id, custom_id, jobs.parse_state(state)[1])
                pipe.publish(
                    constants.REDIS_CANCELS_CHANNEL,
                    wire.encode(wire.Cancel(request_id=request_id, reason=CANCEL_REASON)),
                )
            await pipe.execute()

    async def _unsettled(self, batch_id: str, size: int = 500):
        """The job's unsettled lines, as lists of (custom_id, state) of at most ``size``."""
        chunk: list[tuple[str, str]] = []
        async for custom_id, state in self.store.ledger.scan_lines(batch_id):
            if jobs.parse_state(state)[0] not in jobs.TERMINAL_LINE_STATES:
                chunk.append((custom_id, state))
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    async def _finalize(self, job: JobView, plan: Plan) -> None:
        """Write every result to the results file, enter the final status, then drop the ledger (kept as the file)."""
        spec = job.spec
        now_s = self.clock.now_ms() // 1000
        if plan.final_status == jobs.COMPLETED and job.status == jobs.IN_PROGRESS:
            await self.store.jobs.move_status(spec.id, [jobs.IN_PROGRESS], jobs.FINALIZING, now_s)
        results = [_json(result) + b"\n" async for result in self.store.ledger.scan_results(spec.id)]
        await self.files.write(spec.results_path, results)
        allowed = [jobs.FINALIZING] if plan.final_status == jobs.COMPLETED else [job.status]
        if await self.store.jobs.move_status(spec.id, allowed, plan.final_status, now_s):
            await self.store.jobs.retire(spec.id, now_s + jobs.retention_s(spec, self.settings.jobs))
            if spec.output_expires_after_s is not None:  # its output files exist from now on: they expire from now
                expires_at = jobs.output_files_expire_at(spec, self.settings.jobs.files_retention_s, now_s)
                for file_id in (spec.output_file_id, spec.error_file_id):
                    await self.store.files.reschedule(file_id, expires_at)
            await self.files.delete(spec.prepared_path)
            self._wound_down.discard(spec.id)
            log.info("batch %s ended %s: %s", spec.id, plan.final_status, job.counts, extra={"batch_id": spec.id})

    # --- retention --------------------------------------------------------------------------------------------------

    async def sweep_files(self, now_s: int) -> None:
        """Delete files past their ``expires_at`` (the stored object and the record), and ended jobs past their
        retention (a Message Batch's results file with it)."""
        for batch_id in await self.store.jobs.expired_jobs(now_s):
            job = await self.store.jobs.get_job(batch_id)
            await self.store.jobs.delete_job(batch_id)
            if job is not None and not jobs.output_files(job.spec, 0, 0):  # a Message Batch: no file record of its
                await self.files.delete(job.spec.results_path)  # results file expires it, so it goes with the job
        for file_id in await self.store.files.expired_files(now_s):
            record = await self.store.files.get_file(file_id)
            if record is None:
                await self.redis.zrem(constants.FILE_EXPIRY_KEY, file_id)
                continue
            if record.path:
                await self.files.delete(record.path)
            await self.store.files.delete_file(record)


async def _owned(store: JobStore, batch_id: str, region: str) -> bool:
    """Whether this region holds the highest claim known on the job (a job without claims is this region's)."""
    return await store.owners.owner(batch_id) in (None, region)

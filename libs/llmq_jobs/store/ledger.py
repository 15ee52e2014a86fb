"""A job's per-line ledger in Redis: each line's state (custom_id -> state, codes in :mod:`llmq_jobs.jobs`), its
byte range in the prepared file, its settled result, the retry rounds due, and round 0's cursor.

Every change of a line's state is a compare-and-set in one Lua script together with its counters, so a result
delivered twice, a stale retry round, or a cancel racing a result changes the ledger at most once. With a
:class:`~llmq_jobs.joblog.JobLog`, lines and terminal results go to the job log before Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq_core import constants, wire
from llmq_jobs import jobs
from llmq_jobs.joblog import JobLog

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

LEDGER_KEYS = (
    constants.job_lines_key,
    constants.job_offsets_key,
    constants.job_results_key,
    constants.job_retries_key,
)


@dataclass(frozen=True, slots=True)
class LineChange:
    """One line's compare-and-set for :meth:`Ledger.settle_many` (fields as in :meth:`Ledger.settle`).
    ``dead_letter``: the line ran out of retry rounds, so its caller also dead-letters the result (the store ignores it)."""

    custom_id: str
    expected: str
    new: str
    result: wire.FinalResult | None = None
    retry_due_ms: int | None = None
    counters: Mapping[str, int] = field(default_factory=dict)
    dead_letter: bool = False


class Ledger:
    """The jobs' ledgers. Methods raise redis errors as they come."""

    def __init__(self, redis: Redis, log: JobLog | None = None) -> None:
        self.redis = redis
        self.log = log
        self._settle = redis.register_script(_SETTLE)
        self._cas_line = redis.register_script(_CAS_LINE)
        self._unqueue_retry = redis.register_script(_UNQUEUE_RETRY)

    async def add_lines(
        self,
        batch_id: str,
        lines: Mapping[str, str],
        offsets: Mapping[str, str],
        results: Mapping[str, wire.FinalResult],
        requests: Mapping[str, bytes] = {},
    ) -> None:
        """Write a slice of a job's ledger before the job itself exists (``JobTable.create_job`` makes it visible),
        so a large input never sits in the API pod whole; :meth:`discard_ledger` drops it when the job is not created.
        ``requests``: the runnable lines' prepared requests, for the job log's lines (with the rejected lines' results:
        an API pod writes no ledger record)."""
        if self.log is not None:
            await self.log.put_lines(batch_id, requests, refused=results)
        async with self.redis.pipeline(transaction=False) as pipe:
            put_ledger_on(pipe, batch_id, lines, offsets, results)
            await pipe.execute()

    async def discard_ledger(self, batch_id: str) -> None:
        await self.redis.delete(
            constants.job_lines_key(batch_id), constants.job_offsets_key(batch_id), constants.job_results_key(batch_id)
        )

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
        terminal results go to the job log first; a line whose logged result then lost the race to settle it (a cancel
        racing a result) is logged again as Redis holds it, so the log's last record of a line is the settled one."""
        changes = list(changes)
        logged = {c.custom_id: c.result for c in changes if c.result is not None and c.new in jobs.TERMINAL_LINE_STATES}
        if self.log is not None:
            await self.log.put_results(batch_id, logged)
        async with self.redis.pipeline(transaction=False) as pipe:
            for c in changes:
                keys, args = _settle_call(batch_id, c)
                await self._settle(keys=keys, args=args, client=pipe)
            applied = await pipe.execute()
        lost = [c.custom_id for c, done in zip(changes, applied) if not done and c.custom_id in logged]
        if lost and self.log is not None:
            await self._relog(batch_id, lost)
        return sum(applied)

    async def _relog(self, batch_id: str, custom_ids: list[str]) -> None:
        """Log what Redis holds for lines whose logged result did not settle them: the result that did, or a
        tombstone for a line still unsettled (waiting for a retry round); a line gone from Redis (its ledger retired)
        keeps its records."""
        states = await self.line_states(batch_id, custom_ids)
        stored = await self.redis.hmget(constants.job_results_key(batch_id), custom_ids)
        settled, unsettled = {}, []
        for custom_id, state, data in zip(custom_ids, states, stored):
            if state is None:
                continue
            if jobs.parse_state(state)[0] not in jobs.TERMINAL_LINE_STATES:
                unsettled.append(custom_id)
            elif data:
                settled[custom_id] = wire.decode(data)
        await self.log.put_results(batch_id, settled)
        await self.log.drop_results(batch_id, unsettled)

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


def put_ledger_on(
    pipe, batch_id: str, lines: Mapping[str, str], offsets: Mapping[str, str], results: Mapping[str, wire.FinalResult]
) -> None:
    """Queue on ``pipe`` the writes of ledger lines (custom_id -> state), their offsets and settled results."""
    if lines:
        pipe.hset(constants.job_lines_key(batch_id), mapping=dict(lines))
    if offsets:
        pipe.hset(constants.job_offsets_key(batch_id), mapping=dict(offsets))
    if results:
        pipe.hset(constants.job_results_key(batch_id), mapping={k: wire.encode(v) for k, v in results.items()})


def _settle_call(batch_id: str, change: LineChange) -> tuple[list[str], list]:
    """The keys and arguments of one ``_SETTLE`` call."""
    args = [
        change.custom_id,
        change.expected,
        change.new,
        wire.encode(change.result) if change.result is not None else b"",
        "" if change.retry_due_ms is None else change.retry_due_ms,
    ]
    for name, increment in change.counters.items():
        args += [name, increment]
    keys = [
        constants.job_lines_key(batch_id),
        constants.job_results_key(batch_id),
        constants.job_key(batch_id),
        constants.job_retries_key(batch_id),
    ]
    return keys, args

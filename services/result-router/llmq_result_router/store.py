"""Stored results: the retrieval copy of every final result (``GET /v1/requests/{id}``, idempotent replays), bounded
per tenant.

A tenant keeps at most ``max_bytes`` (and ``max_results``) of stored results; storing one past that drops the
tenant's oldest first, in the same Lua script, so no other tenant's results are touched and the bound holds under any
number of routers. Nothing else depends on these copies: HTTP waiters get their result over pub/sub, Kafka reply
topics and batch-job ledgers from the llmq.results record itself.

The script deletes dropped results by name (keys it is not passed), so it needs a standalone Redis, as the job
ledger's multi-key scripts do. Past ``maxmemory`` Redis refuses a script at its first write that may enlarge memory
and lets the rest of a script through once one write went in: the result's SET comes first, so a refused store
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from llmq_core import constants
from llmq_core.clock import SYSTEM_CLOCK, Clock

# KEYS: the result, the tenant's index, the tenant's byte counter. ARGV: value, ttl ms, now ms, request id, result
# key prefix, max bytes, max results. Returns {STORED | DUPLICATE | TOO_LARGE, results dropped}.
_PUT = """
local function size_of(member) return tonumber(string.match(member, '^(%d+):')) end
local value, ttl, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local max_bytes, max_results = tonumber(ARGV[6]), tonumber(ARGV[7])
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 0} end
if #value > max_bytes then return {2, 0} end
-- The first write may enlarge memory, so Redis refuses it (and the script, changing nothing) past maxmemory.
redis.call('SET', KEYS[1], value, 'PX', ttl)
local total = tonumber(redis.call('GET', KEYS[3]))
if redis.call('EXISTS', KEYS[2]) == 0 then
  total = 0
elseif not total then  -- the counter alone was evicted: count again
  total = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do total = total + size_of(m) end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)) do total = total - size_of(m) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)  -- their results have expired
local dropped = 0
while total + #value > max_bytes or redis.call('ZCARD', KEYS[2]) >= max_results do
  local popped = redis.call('ZPOPMIN', KEYS[2])
  if #popped == 0 then total = 0 break end
  local size = size_of(popped[1])
  local request_id = string.sub(popped[1], #tostring(size) + 2)
  total = total - size
  if request_id ~= ARGV[4] then redis.call('DEL', ARGV[5] .. request_id) end
  dropped = dropped + 1
end
redis.call('ZADD', KEYS[2], now, #value .. ':' .. ARGV[4])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SET', KEYS[3], total + #value, 'PX', ttl)
return {1, dropped}
"""


DUPLICATE, STORED, TOO_LARGE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Stored:
    first: bool  # no result was stored for this request before (False: a redelivered duplicate)
    kept: bool  # stored now (False for a duplicate, or a result larger than the tenant's whole bound)
    dropped: int  # the tenant's oldest results dropped to make room


class ResultStore:
    """Puts results under ``result_key`` for ``ttl_ms``, within the per-tenant bounds. Raises redis errors as they
    come (a refused write changes nothing)."""

    def __init__(
        self, redis: Redis, ttl_ms: int, max_bytes: int, max_results: int, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._put = redis.register_script(_PUT)
        self.ttl_ms = ttl_ms
        self.max_bytes = max_bytes
        self.max_results = max_results
        self.clock = clock

    async def put(self, tenant_id: str, request_id: str, value: bytes) -> Stored:
        """Store ``value`` (the msgpack FinalResult) unless a result of ``request_id`` is stored already: the first
        stored result wins, so a redelivered duplicate never changes what a caller may have read."""
        keys = [
            constants.result_key(request_id),
            constants.result_index_key(tenant_id),
            constants.result_bytes_key(tenant_id),
        ]
        args = [
            value,
            self.ttl_ms,
            self.clock.now_ms(),
            request_id,
            constants.REDIS_RESULT_PREFIX,
            self.max_bytes,
            self.max_results,
        ]
        code, dropped = await self._put(keys=keys, args=args)
        return Stored(first=code != DUPLICATE, kept=code == STORED, dropped=dropped)

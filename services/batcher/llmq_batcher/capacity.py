"""The fleet's capacity ledgers in Redis: a batcher's claims (one Lua script per claim, so claims of several batchers
are serialised). The rule is :class:`llmq_batcher.ledger.WorkerLedger`'s, which the simulator runs in memory; an
in-process test holds the two to the same answers. The worker writes its side (llmq_worker.loop).

A worker whose ledger is not written (an older worker, or Redis lost it) is claimed without a bound, as batchers did
before the ledger: capacity is then what each batcher sees in heartbeats. Redis slow or down: the claim fails and its
batch waits (``CLAIM_RETRY_MS``) rather than go out uncounted; heartbeats travel over Redis too, so without it no
worker stays live anyway.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from llmq_batcher.flights import BatchDispatch
from llmq_batcher.ledger import Grant
from llmq_core.names import Names
from llmq_core.settings import Settings

CLAIM_TIMEOUT_S = 0.25  # a claim slower than this fails (its batch waits): a stalled Redis must not stall dispatch
CLAIM_RETRY_MS = 100  # how long a model's batches wait after a claim failed

# KEYS: the worker's ledger, its grants. ARGV: batch_id, requests, now_ms, grant_ttl_ms, lead_ms, margin_ms,
# queue_bound, urgent (1: no deferred request, so a continuous worker's preemptible room counts too; a ledger without
# the field, an older worker's, reads 0). Returns {granted, next_ms, next_room} (WorkerLedger.claim's Grant).
_CLAIM = """
local f = redis.call('HMGET', KEYS[1], 'max_slots', 'fixed', 'batch_time_ms', 'running', 'queued', 'ends_ms',
  'preemptible')
local want = tonumber(ARGV[2])
if not f[1] then return {want, 0, 0} end
local max_slots, fixed, bt = tonumber(f[1]), tonumber(f[2]) == 1, tonumber(f[3])
local running, queued, ends = tonumber(f[4]), tonumber(f[5]), tonumber(f[6]) or 0
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local in_transit, live = 0, 0
local grants = redis.call('HGETALL', KEYS[2])
for i = 1, #grants, 2 do
  local n, expires = string.match(grants[i + 1], '^(%d+):(%d+)$')
  if tonumber(expires) <= now then
    redis.call('HDEL', KEYS[2], grants[i])
  else
    in_transit, live = in_transit + tonumber(n), live + 1
  end
end
local room
if fixed then
  room = math.max(max_slots - queued - in_transit, 0)
else
  local preemptible = 0
  if ARGV[8] == '1' then preemptible = tonumber(f[7]) or 0 end
  room = math.max(max_slots + tonumber(ARGV[7]) + preemptible - running - queued - in_transit, 0)
end
local function grant(n)
  if n > 0 then
    redis.call('HSET', KEYS[2], ARGV[1], n .. ':' .. (now + ttl))
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  return n
end
if not fixed then return {grant(math.min(want, room)), 0, 0} end
if (running == 0 and queued == 0 and live == 0) or ends <= now then
  ends = now + bt
  redis.call('HSET', KEYS[1], 'ends_ms', ends)
  return {grant(math.min(want, room)), ends, max_slots}
end
if now < ends - tonumber(ARGV[5]) then return {0, ends, room} end
if now > ends - tonumber(ARGV[6]) then return {0, ends + bt, max_slots} end
local g = grant(math.min(want, room))
if g < room then return {g, ends, room - g} end
return {g, ends + bt, max_slots}
"""


class SharedCapacity:
    """One batcher's claims on the workers' ledgers (keys of :meth:`Names.capacity_keys`)."""

    def __init__(self, redis: Redis, names: Names, settings: Settings) -> None:
        batcher = settings.batcher
        self._names = names
        self._ttl_ms = batcher.capacity_grant_ttl_ms
        self._lead_ms = max(batcher.fixed_engine_leads_ms, default=0)
        self._margin_ms = batcher.dispatch_margin_ms
        self._bound = batcher.worker_queue_bound
        self._claim = redis.register_script(_CLAIM)

    async def claim(self, batch: BatchDispatch, now_ms: int) -> Grant:
        """Claim ``batch``'s requests from its worker's ledger (a batch without deferred requests may also take a
        continuous-batching worker's preemptible room). Raises what Redis raises, TimeoutError past
        CLAIM_TIMEOUT_S."""
        urgent = int(batch.urgent())
        args = (
            batch.batch_id,
            len(batch.requests),
            now_ms,
            self._ttl_ms,
            self._lead_ms,
            self._margin_ms,
            self._bound,
            urgent,
        )
        granted, next_ms, next_room = await asyncio.wait_for(
            self._claim(keys=self._names.capacity_keys(batch.worker_id), args=args), CLAIM_TIMEOUT_S
        )
        return Grant(int(granted), int(next_ms), int(next_room))

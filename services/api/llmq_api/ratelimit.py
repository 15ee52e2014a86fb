"""Per-tenant rate limits shared by every API pod: two token buckets per tenant in Redis, taken by one Lua script.

Bucket ``requests`` holds up to ``requests_per_min`` and refills at that rate per minute; bucket ``tokens`` the
same with ``tokens_per_min``, charged the request's prompt tokens plus ``max_tokens * n``. A request passes only
when both hold enough (a cost above a bucket's size is charged as the whole bucket, so a large request waits for a
full bucket instead of never passing); a refused request takes nothing. Time comes from the pod's injected clock.
Redis unreachable lets requests through (logged): the pod's own admission control still bounds the load; Redis
refusing the write (maxmemory) answers 503 ``store_unavailable``, or every tenant's limits would lapse while it is full.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from llmq_core.clock import Clock
from llmq_core.constants import ratelimit_key
from llmq_api.admission import Rejection, retry_after_s, too_many_requests
from llmq_api.auth import Principal
from llmq_api.errors import store_unavailable
from llmq_api.validation import ValidRequest

log = logging.getLogger(__name__)

TIMEOUT_S = 0.25
BUCKETS = ("requests", "tokens")

# KEYS: the requests and tokens buckets. ARGV: now_ms, then (limit per minute, cost) for each bucket (limit 0: none).
# Levels are kept in tokens x 60000 (token-milliseconds per minute), so refills of `limit` per ms stay whole numbers.
# Returns {1, 0, 0} when taken, {0, wait_ms, bucket number} when refused.
_TAKE = """
local now = tonumber(ARGV[1])
local after, stamp, wait, which = {}, {}, 0, 0
for i = 1, 2 do
  local limit, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if limit > 0 then
    local size = limit * 60000
    local state = redis.call('HMGET', KEYS[i], 'level', 'ms')
    local level, last = tonumber(state[1]) or size, tonumber(state[2]) or now
    level = math.min(size, level + math.max(0, now - last) * limit)
    cost = math.min(cost * 60000, size)
    after[i], stamp[i] = level - cost, math.max(now, last)
    if level < cost then
      local need = math.ceil((cost - level) / limit)
      if need > wait then wait, which = need, i end
    end
  end
end
if wait > 0 then return {0, wait, which} end
for i = 1, 2 do
  if after[i] then
    redis.call('HSET', KEYS[i], 'level', string.format('%d', after[i]), 'ms', string.format('%d', stamp[i]))
    redis.call('PEXPIRE', KEYS[i], 60000)
  end
end
return {1, 0, 0}
"""


def token_cost(valid: ValidRequest) -> int:
    """What a request charges the ``tokens`` bucket: its prompt tokens plus the most it may generate."""
    return valid.prompt_tokens + valid.sampling.max_tokens * valid.sampling.n


class RateLimiter:
    """Takes from a tenant's buckets (see the module doc); ``acquire`` answers None or a 429 Rejection."""

    def __init__(self, redis: Redis, clock: Clock) -> None:
        self._take = redis.register_script(_TAKE)
        self._clock = clock

    async def acquire(self, principal: Principal, tokens: int) -> Rejection | None:
        """Charge one request of ``tokens`` to ``principal``'s tenant; a Rejection when a bucket is short."""
        limits = (principal.requests_per_min, principal.tokens_per_min)
        if not any(limits):
            return None
        keys = [ratelimit_key(principal.tenant_id, bucket) for bucket in BUCKETS]
        args = [self._clock.now_ms(), limits[0], 1, limits[1], tokens]
        try:
            taken, wait_ms, which = await asyncio.wait_for(self._take(keys=keys, args=args), TIMEOUT_S)
        except ResponseError as exc:  # Redis refuses writes (maxmemory): limits cannot be kept, so refuse the request
            raise store_unavailable(exc) from None
        except Exception as exc:
            log.warning("rate limit check failed, letting the request through: %r", exc)
            return None
        if taken:
            return None
        bucket = BUCKETS[which - 1]
        retry_s = retry_after_s(wait_ms)
        message = (f"Rate limit reached for tenant {principal.tenant_id} on {bucket} per min: limit "
                   f"{limits[which - 1]}. Please try again in {retry_s}s.")
        return Rejection(f"tenant_{bucket}", too_many_requests(message, retry_s, type=bucket))

"""Who may drive a job: the lease one result-router holds on it in this region, and the region that owns it (the
highest claim known here, from the owners topics: :mod:`llmq_jobs.joblog`)."""

from __future__ import annotations

from redis.asyncio import Redis

from llmq_core import constants
from llmq_jobs.jobs import JobOwner

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


class Leases:
    """One result-router drives a job at a time: a token with a TTL, taken or extended while it works."""

    def __init__(self, redis: Redis) -> None:
        self._lease = redis.register_script(_LEASE)
        self._release = redis.register_script(_RELEASE)

    async def hold_lease(self, batch_id: str, token: str, ttl_ms: int) -> bool:
        """Take the job's lease (free) or extend it (ours); False when another router holds it."""
        return bool(await self._lease(keys=[constants.job_lease_key(batch_id)], args=[token, ttl_ms]))

    async def release_lease(self, batch_id: str, token: str) -> None:
        await self._release(keys=[constants.job_lease_key(batch_id)], args=[token])


class Owners:
    """The job hash's ``owner_region``/``owner_epoch``: the fence that keeps a region that lost a job off it."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._claim = redis.register_script(_CLAIM)

    async def owner(self, batch_id: str) -> str | None:
        """The region of the highest claim on the job known here; None when none is recorded (a job created before
        claims existed: it is this region's)."""
        region = await self.redis.hget(constants.job_key(batch_id), "owner_region")
        return region.decode() if region else None

    async def claim(self, batch_id: str) -> JobOwner | None:
        """The highest claim on the job known here (region and epoch); None when none is recorded."""
        region, epoch = await self.redis.hmget(constants.job_key(batch_id), ["owner_region", "owner_epoch"])
        return None if not region else JobOwner(batch_id=batch_id, region=region.decode(), epoch=int(epoch or 0))

    async def raise_owner(self, claim: JobOwner) -> bool:
        """Record ``claim`` as the job's owner if it outranks the one known (the job must be in this Redis)."""
        return bool(await self._claim(keys=[constants.job_key(claim.batch_id)], args=[claim.region, claim.epoch]))


def owner_fields(owner: JobOwner | None) -> dict[str, str | int]:
    """The job hash's fields for ``owner`` (none for no claim)."""
    return {} if owner is None else {"owner_region": owner.region, "owner_epoch": owner.epoch}

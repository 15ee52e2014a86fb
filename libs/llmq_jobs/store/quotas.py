"""Per-tenant byte counters in Redis: the storage its live uploads take, and the result bytes its running jobs may
write to their ledgers. Reserved before the bytes exist, given back when they go."""

from __future__ import annotations

from redis.asyncio import Redis

from llmq_core import constants

# KEYS: a tenant's counter. ARGV: bytes, quota. Adds the bytes when they fit under the quota; returns the bytes in
# use before (-1 when they do not fit).
_RESERVE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return -1 end
redis.call('INCRBY', KEYS[1], ARGV[1])
return used
"""

# KEYS: the job, its tenant's result-bytes counter. Gives back the job's reservation once (the field goes with it).
_RELEASE_RESULT_BYTES = """
local reserved = redis.call('HGET', KEYS[1], 'result_bytes')
if not reserved then return 0 end
redis.call('HDEL', KEYS[1], 'result_bytes')
return redis.call('DECRBY', KEYS[2], reserved)
"""


class Quotas:
    """The tenants' storage and result-byte counters. Methods raise redis errors as they come."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._reserve = redis.register_script(_RESERVE)
        self._release_result_bytes = redis.register_script(_RELEASE_RESULT_BYTES)

    async def reserve_storage(self, tenant_id: str, size: int, quota: int) -> int | None:
        """Count ``size`` more bytes against the tenant's storage ``quota``; the bytes in use before, or None (and
        nothing counted) when they do not fit."""
        used = await self._reserve(keys=[constants.tenant_storage_key(tenant_id)], args=[size, quota])
        return None if used < 0 else used

    async def release_storage(self, tenant_id: str, size: int) -> None:
        """Give back bytes reserved for an upload that was not kept."""
        await self.redis.decrby(constants.tenant_storage_key(tenant_id), size)

    async def stored_bytes(self, tenant_id: str) -> int:
        return int(await self.redis.get(constants.tenant_storage_key(tenant_id)) or 0)

    async def reserve_result_bytes(self, tenant_id: str, size: int, bound: int) -> int | None:
        """Count a new job's ``size`` result bytes against its tenant's ``bound``; the bytes reserved before, or None
        (and nothing counted) when they do not fit. :meth:`JobTable.create_job` hands the reservation to the job."""
        used = await self._reserve(keys=[constants.tenant_result_bytes_key(tenant_id)], args=[size, bound])
        return None if used < 0 else used

    async def unreserve_result_bytes(self, tenant_id: str, size: int) -> None:
        """Give back a reservation whose job was not created."""
        await self.redis.decrby(constants.tenant_result_bytes_key(tenant_id), size)

    async def release_job_result_bytes(self, batch_id: str, tenant_id: str) -> None:
        """Give back the reservation a created job holds (its ``result_bytes`` field), at most once."""
        await self._release_result_bytes(
            keys=[constants.job_key(batch_id), constants.tenant_result_bytes_key(tenant_id)]
        )

"""A tenant's token bucket as the API pods keep it in Redis (llmq_api/ratelimit.py), read by the system tests that
check a request's settled quota: charged its estimate at admission, given back what its usage left unused."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from llmq_api.ratelimit import MINUTE_MS, TOKENS_BUCKET
from llmq_core.constants import ratelimit_key
from tests.system.faults.stack import FaultStack


@dataclass(frozen=True)
class TokenBucket:
    """``tenant``'s bucket: its level in tokens x ms of its period (a minute) and the ms of its last change; it refills
    ``tokens_per_min``. A test gives its tenant a bucket of one request's estimate, so that admission empties it and
    no cap hides a refund within a minute."""

    tenant: str
    tokens_per_min: int
    level: int
    ms: int

    @classmethod
    async def read(cls, stack: FaultStack, tenant: str, tokens_per_min: int) -> TokenBucket:
        redis = stack.redis()
        try:
            level, ms = await redis.hmget(ratelimit_key(tenant, TOKENS_BUCKET), ["level", "ms"])
        finally:
            await redis.aclose()
        assert level is not None, f"no request of {tenant} took anything from its bucket"
        return cls(tenant, tokens_per_min, int(level), int(ms))

    @property
    def empty(self) -> bool:
        return self.level == 0

    @property
    def below_cap(self) -> bool:
        return self.level < self.tokens_per_min * MINUTE_MS

    def tokens_given_back(self, later: TokenBucket) -> float:
        """Tokens returned to the bucket between this state and ``later``: the change less the refill."""
        return (later.level - self.level - (later.ms - self.ms) * self.tokens_per_min) / MINUTE_MS

    async def settled(self, stack: FaultStack, timeout_s: float = 20) -> TokenBucket:
        """The bucket once the pod gave back what the request left unused (polled with a deadline)."""
        async with asyncio.timeout(timeout_s):
            while (bucket := await TokenBucket.read(stack, self.tenant, self.tokens_per_min)).ms == self.ms:
                await asyncio.sleep(0.1)
        return bucket

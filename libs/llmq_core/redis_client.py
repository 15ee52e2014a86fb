"""Redis clients as llmq services configure them (redis-py asyncio)."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

COMMAND_RETRIES = 2


def make_redis(url: str, **options) -> Redis:
    """A client whose commands are retried on connection errors (twice, 100 ms then 200 ms later).

    After a Redis restart every pooled connection fails on its next use: without a retry that command (a reply, a
    heartbeat) is lost although Redis is back. ``options`` go to ``Redis.from_url``.
    """
    return Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), COMMAND_RETRIES), **options)

"""Redis clients as llmq services configure them (redis-py asyncio), and the check of a Redis' memory policy."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from llmq_core.settings import Settings, secret

log = logging.getLogger(__name__)

COMMAND_RETRIES = 2
CONFIG_TIMEOUT_S = 2.0
MEMORY_POLICY = "volatile-lru"  # what llmq's own stacks run: only keys with a TTL are ever evicted


def connection_options(settings: Settings) -> dict:
    """``Redis.from_url`` options for this service's ACL user and TLS (``rediss://`` URLs); empty when none is set.
    The one place they are built: services through :func:`make_redis`, the CLI's synchronous clients directly."""
    options: dict = {}
    if settings.redis.username:
        options["username"] = settings.redis.username
    password = secret(settings.redis.password, settings.redis.password_file)
    if password:
        options["password"] = password
    for option, path in (
        ("ssl_ca_certs", settings.redis.ssl_cafile),
        ("ssl_certfile", settings.redis.ssl_certfile),
        ("ssl_keyfile", settings.redis.ssl_keyfile),
    ):
        if path:
            options[option] = path
    return options


def make_redis(settings: Settings, **options) -> Redis:
    """A client of ``settings.redis_url`` as its ACL user (:func:`connection_options`) whose commands are retried on
    connection errors (twice, 100 ms then 200 ms later).

    After a Redis restart every pooled connection fails on its next use: without a retry that command (a reply, a
    heartbeat) is lost although Redis is back. ``options`` go to ``Redis.from_url``.
    """
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), COMMAND_RETRIES)
    return Redis.from_url(settings.redis.url, retry=retry, **connection_options(settings), **options)


def memory_policy_warning(maxmemory_bytes: int, policy: str) -> str | None:
    """What is wrong with a Redis' ``maxmemory`` / ``maxmemory-policy`` for llmq, or None.

    Batch-job state (ledgers, job records, file records) has no TTL and must never be evicted; stored results and
    idempotency claims have one and may be. ``noeviction`` is safe too: writes are refused (503) when it is full.
    """
    if maxmemory_bytes == 0:
        return (
            f"Redis has no maxmemory: stored results and idempotency claims may grow it until the host runs out "
            f"of memory; set maxmemory and maxmemory-policy {MEMORY_POLICY}"
        )
    if policy.startswith("allkeys-"):
        return (
            f"Redis maxmemory-policy is {policy}: it may evict batch-job ledgers and records, which have no TTL, "
            f"and lose jobs; use {MEMORY_POLICY}"
        )
    return None


async def check_memory_policy(redis: Redis, service: str) -> None:
    """Log a warning when the Redis ``service`` uses could grow without bound or evict state without a TTL.
    Production Redis is its operator's: llmq only says so. CONFIG may be disabled (managed Redis): then it says that."""
    try:
        config = await asyncio.wait_for(redis.config_get("maxmemory*"), CONFIG_TIMEOUT_S)
    except Exception as exc:
        log.warning(
            "%s: could not read Redis' maxmemory settings (%r); make sure maxmemory is set and "
            "maxmemory-policy is %s or noeviction",
            service,
            exc,
            MEMORY_POLICY,
        )
        return
    warning = memory_policy_warning(int(config.get("maxmemory", 0)), str(config.get("maxmemory-policy", "")))
    if warning is not None:
        log.warning("%s: %s", service, warning)

"""Idempotency-Key claims and stored results in Redis.

The first request with a tenant's key claims it (``SET NX``): the claim names the request_id it runs under, a
fingerprint of its parameters and its deadline, and lives until the deadline plus the result TTL. A retry with the same
key finds the claim and gets that request's stored result (``result_key``, written by the result-router), or waits for
it while it still runs, instead of running again. A claim whose request was never produced, timed out or lost its
client is released, so a retry then runs afresh under a new request_id (the old one is cancelled and stays so).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from typing import TypeVar

import msgspec
from redis.asyncio import Redis

from llmq_api.errors import invalid
from llmq_api.validation import ValidRequest
from llmq_api.waiters import Waiter, WaiterRegistry
from llmq_core import constants, wire
from llmq_core.clock import Clock, Sleep

log = logging.getLogger(__name__)

MAX_KEY_CHARS = 255
POLL_S = 0.1  # how often a retry that joined a running request looks for its result
T = TypeVar("T")
_PRINTABLE = re.compile(r"[\x21-\x7e][\x20-\x7e]*")

# Delete KEYS[1] only while it still holds the claim of request ARGV[1] (a newer claim is someone else's).
_RELEASE = """
local claim = redis.call('GET', KEYS[1])
if claim and cjson.decode(claim)['request_id'] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """Who owns an Idempotency-Key: the request_id it runs under, parameters' fingerprint, deadline (epoch ms)."""

    request_id: str
    fingerprint: str
    deadline_ms: int


def parse_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header value (None when absent); 400 unless 1-255 printable ASCII characters."""
    if value is None:
        return None
    key = value.strip()
    if not (len(key) <= MAX_KEY_CHARS and _PRINTABLE.fullmatch(key)):
        raise invalid(
            f"{constants.HTTP_IDEMPOTENCY_KEY} must be 1-{MAX_KEY_CHARS} printable ASCII characters",
            param=constants.HTTP_IDEMPOTENCY_KEY,
            code="invalid_idempotency_key",
        )
    return key


def fingerprint(valid: ValidRequest, traffic_class: str) -> str:
    """Hex digest of everything that shapes a request's result: a retry must repeat it exactly."""
    return hashlib.sha256(msgspec.msgpack.encode((traffic_class, valid))).hexdigest()


class IdempotencyStore:
    """Claims (``idempotency_key``) and stored results (``result_key``) in Redis; calls may raise on Redis errors."""

    def __init__(self, redis: Redis, clock: Clock, result_ttl_ms: int, sleep: Sleep = asyncio.sleep) -> None:
        """``sleep`` waits between :meth:`follow`'s polls (tests pass one they drive)."""
        self._redis = redis
        self._clock = clock
        self._sleep = sleep
        self._result_ttl_ms = result_ttl_ms
        self._release = redis.register_script(_RELEASE)

    async def find(self, tenant_id: str, key: str) -> Claim | None:
        """The claim on ``key`` if there is one."""
        data = await self._redis.get(constants.idempotency_key(tenant_id, key))
        return msgspec.json.decode(data, type=Claim) if data else None

    async def claim(self, tenant_id: str, key: str, claim: Claim) -> Claim | None:
        """Claim ``key`` for ``claim``; None when it is ours now, else the claim that got there first."""
        ttl_ms = max(claim.deadline_ms - self._clock.now_ms(), 0) + self._result_ttl_ms
        redis_key = constants.idempotency_key(tenant_id, key)
        for _ in range(2):  # the other claim may expire between SET NX and GET
            if await self._redis.set(redis_key, msgspec.json.encode(claim), nx=True, px=ttl_ms):
                return None
            existing = await self.find(tenant_id, key)
            if existing is not None:
                return existing
        return None  # it kept vanishing between SET NX and GET: run rather than wait on nothing

    async def release(self, tenant_id: str, key: str, request_id: str) -> None:
        """Drop the claim if it still belongs to ``request_id`` (best effort: it expires anyway)."""
        try:
            await self._release(keys=[constants.idempotency_key(tenant_id, key)], args=[request_id])
        except Exception as exc:
            log.warning(
                "releasing idempotency claim of %s failed: %r", request_id, exc, extra={"request_id": request_id}
            )

    async def result(self, request_id: str) -> wire.FinalResult | None:
        """The stored FinalResult of ``request_id`` (None when there is none, or it is undecodable)."""
        return _decoded(await self._redis.get(constants.result_key(request_id)), wire.FinalResult)

    async def follow_stream(self, waiter: Waiter, registry: WaiterRegistry, until_ms: int) -> None:
        """:meth:`follow`, passing ``waiter`` the chunks of its stream's log (``constants.stream_log_key``) from the
        first as they are written, each poll's before its stored result (a stream that ended replays whole)."""
        request_id, logged = waiter.request_id, 0
        while not waiter.done and self._clock.now_ms() < until_ms:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.lrange(constants.stream_log_key(request_id), logged, -1)
                    pipe.get(constants.result_key(request_id))
                    entries, stored = await pipe.execute()
            except Exception as exc:
                log.warning("reading the stream of %s failed: %r", request_id, exc)
                entries, stored = [], None
            logged += len(entries)
            for entry in entries:
                if (chunk := _decoded(entry, wire.TokenChunk)) is not None:
                    waiter.offer(chunk)
            if (result := _decoded(stored, wire.FinalResult)) is not None:
                registry.resolve(waiter, result)
                return
            await self._sleep(POLL_S)

    async def follow(self, waiter: Waiter, registry: WaiterRegistry, until_ms: int) -> None:
        """Resolve ``waiter`` with its request's stored result once there is one; give up when it is resolved
        otherwise (deadline, client gone) or at ``until_ms``. Redis errors are retried at the next poll."""
        while not waiter.done and self._clock.now_ms() < until_ms:
            try:
                result = await self.result(waiter.request_id)
            except Exception as exc:
                log.warning("looking up the result of %s failed: %r", waiter.request_id, exc)
                result = None
            if result is not None:
                registry.resolve(waiter, result)
                return
            await self._sleep(POLL_S)


def _decoded(data: bytes | None, kind: type[T]) -> T | None:
    """``data`` as a wire message of ``kind`` (None when there is none, or it is undecodable or of another kind)."""
    if not data:
        return None
    try:
        message = wire.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return message if isinstance(message, kind) else None

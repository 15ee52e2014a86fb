"""One worker per partition of llmq.batches: a Redis lease (``worker_lease_key(partition)``, PX ttl).

A Redis key rather than Kafka's group protocol: the partition is the worker's address (the batcher routes by the
partition a heartbeat names), so it is fixed by the operator, not handed out by a rebalance; and the key is in the
Redis that heartbeats and liveness already depend on. A worker takes the lease before it consumes; one started on a
held partition waits as a standby and takes over once the holder lets go (stopped) or its lease lapses (killed: at
most ``ttl_ms`` later; at once when the holder was a process of this host that is gone, as a restarted worker finds
it). The holder renews it every third of ``ttl_ms`` (and takes it again after Redis lost it); finding another holder
ends the worker, so two never consume one partition for longer than a renewal interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path

import msgspec
from redis.asyncio import Redis

from llmq_core.clock import Sleep
from llmq_core.constants import worker_lease_key

log = logging.getLogger(__name__)

# Compare and act in one step. Renew: extend it while it names us, take it again when it is gone (Redis restarted).
_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if not holder then return redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2]) and 1 or 0 end
return 0
"""
_REPLACE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'px', ARGV[3]) and 1 or 0 end return 0"  # noqa: E501
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class Holder(msgspec.Struct, frozen=True):
    """Who holds a lease: shown to a standby, and told apart from a restarted process of the same worker."""

    worker_id: str
    pid: int
    host: str

    def describe(self) -> str:
        return f"worker {self.worker_id} (pid {self.pid} on {self.host})"


def this_process(worker_id: str) -> Holder:
    return Holder(worker_id=worker_id, pid=os.getpid(), host=socket.gethostname())


def gone(holder: Holder, host: str = socket.gethostname(), proc: Path = Path("/proc")) -> bool:
    """Whether ``holder`` was a process of this host that no longer runs (or is a zombie); False when it is elsewhere
    (its lease then has to lapse)."""
    if holder.host != host:
        return False
    try:
        state = (proc / str(holder.pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


class PartitionLease:
    def __init__(
        self, redis: Redis, partition: int, holder: Holder, ttl_ms: int, sleep: Sleep = asyncio.sleep, gone=gone
    ) -> None:
        self.redis = redis
        self.partition = partition
        self.key = worker_lease_key(partition)
        self.holder = msgspec.json.encode(holder)
        self.ttl_ms = ttl_ms
        self.renew_s = ttl_ms / 3000
        self._sleep = sleep
        self._gone = gone

    async def acquire(self) -> None:
        """Take the lease, waiting as a standby while another live worker holds it (logged once per holder)."""
        seen = None
        while not await self._take():
            current = await self.redis.get(self.key)
            if current is not None and current != seen:
                seen = current
                log.warning(
                    "partition %d of llmq.batches is held by %s: waiting as its standby (it takes over when that"
                    " worker stops, or at most %d ms after it died)",
                    self.partition,
                    _decoded(current).describe(),
                    self.ttl_ms,
                )
            await self._sleep(self.renew_s)
        log.info("holding partition %d of llmq.batches (lease %s, ttl %d ms)", self.partition, self.key, self.ttl_ms)

    async def _take(self) -> bool:
        if await self.redis.set(self.key, self.holder, nx=True, px=self.ttl_ms):
            return True
        current = await self.redis.get(self.key)
        if current is None or not self._gone(_decoded(current)):
            return False
        log.info("the holder of partition %d, %s, is gone: taking over", self.partition, _decoded(current).describe())
        return bool(await self.redis.eval(_REPLACE, 1, self.key, current, self.holder, self.ttl_ms))

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew the lease every third of its ttl until ``stop`` is set; returns early when it was lost (another
        worker holds it now). A failed renewal (Redis away) is retried at the next interval."""
        while True:
            with contextlib.suppress(TimeoutError):  # stop ends it at once: the worker's exit does not wait
                async with asyncio.timeout(self.renew_s):
                    await stop.wait()
            if stop.is_set():
                return
            try:
                renewed = await self.redis.eval(_RENEW, 1, self.key, self.holder, self.ttl_ms)
            except Exception as exc:  # noqa: BLE001 - Redis away: the lease may lapse; the next renewal tells
                log.warning("renewing the lease of partition %d failed: %r", self.partition, exc)
                continue
            if not renewed:
                log.error(
                    "lost the lease of partition %d of llmq.batches (another worker holds it): stopping", self.partition
                )
                return

    async def release(self) -> None:
        """Let go (a clean stop), so that a standby takes over at once; nothing when it is no longer ours."""
        try:
            await self.redis.eval(_RELEASE, 1, self.key, self.holder)
        except Exception as exc:  # noqa: BLE001 - it lapses by itself
            log.warning("releasing the lease of partition %d failed: %r", self.partition, exc)


def _decoded(value: bytes) -> Holder:
    try:
        return msgspec.json.decode(value, type=Holder)
    except msgspec.DecodeError:  # another version's value: whoever it is, it is not known to be gone
        return Holder(worker_id=value.decode(errors="replace"), pid=0, host="")

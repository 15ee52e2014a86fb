"""One Kafka reply per result across router kills and rebalances: claim, produce, mark delivered; a claim found
unmarked is settled by looking for the reply in its topic.

llmq.results is consumed at least once, so a result can be routed twice: by this router again after a transient
error, or by the next owner of its partition after a rebalance or a kill -9. A marker set after the produce cannot
stop the second copy when the first router dies between the broker's append and the mark, a window as long as the
produce's round trip. So a router claims the delivery before producing (``c <owner> <claimed_ms> <until_ms>`` at the
delivered key), marks it delivered after (``1``), and a router that finds a claim without the mark waits while the
claimer lives and its lease runs (``until_ms``: past it the claimer's produce has landed or failed), then looks for
the reply in the reply topic itself: every reply carries ``HEADER_DELIVERY`` (its delivered key). Found, the delivery
is marked; not found, the claim is taken over (compare-and-set) and the reply produced.

:func:`plan_claim` is the pure decision; :class:`DeliveryClaims` does its Redis calls; :class:`KafkaReplyFinder`
searches a reply topic's partition.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from llmq_core import constants
from llmq_core.clock import Clock
from llmq_core.kafka import PRODUCER_REQUEST_TIMEOUT_MS
from llmq_core.metrics import RouterMetrics

log = logging.getLogger(__name__)

DELIVERED = b"1"
CLOCK_SKEW_MS = 5_000  # routers' clocks may differ this much: a search starts this long before the claim
POLL_MS = 50  # how often a claim held by a live router is read again
SEARCH_TIMEOUT_S = 10.0  # a search that cannot read to the partition's end is retried with the whole fetch
ROUTER_SERVICE = "result-router"  # whose alive keys (runtime.keep_alive) tell a live claimer from a dead one

# Take over an unmarked claim only while it is the one the search was for (another router may have taken it since).
_TAKEOVER = """
-- claim takeover
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


class Step(enum.Enum):
    PRODUCE = "produce"  # this router holds the claim: produce the reply, then mark it delivered
    SKIP = "skip"  # delivered before: nothing to do
    WAIT = "wait"  # a live router holds the claim within its lease: read it again in ``wait_ms``
    SEARCH = "search"  # an unmarked claim whose produce is over: is the reply in its topic?


@dataclass(frozen=True, slots=True)
class Claim:
    owner: str
    claimed_ms: int
    until_ms: int

    def encode(self) -> bytes:
        return f"c {self.owner} {self.claimed_ms} {self.until_ms}".encode()

    @classmethod
    def decode(cls, value: bytes) -> Claim | None:
        parts = value.decode(errors="replace").split(" ")
        if len(parts) != 4 or parts[0] != "c" or not (parts[2].isdigit() and parts[3].isdigit()):
            return None
        return cls(parts[1], int(parts[2]), int(parts[3]))


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    step: Step
    wait_ms: int = 0  # WAIT
    since_ms: int = 0  # SEARCH: the reply, if it was produced, was appended after this (broker timestamps)


def plan_claim(found: bytes | None, owner: str, now_ms: int, owner_alive: bool) -> ClaimPlan:
    """What to do about a delivered key that held ``found`` when this router (``owner``) tried to claim it at
    ``now_ms`` (None: the claim was made). ``owner_alive``: whether the claimer's alive key exists. A value this code
    did not write counts as delivered: a wrong guess costs a reply, never a second one."""
    if found is None:
        return ClaimPlan(Step.PRODUCE)
    claim = Claim.decode(found) if found != DELIVERED else None
    if claim is None:
        return ClaimPlan(Step.SKIP)
    if claim.owner != owner and owner_alive and now_ms < claim.until_ms:
        return ClaimPlan(Step.WAIT, wait_ms=min(POLL_MS, claim.until_ms - now_ms))
    return ClaimPlan(Step.SEARCH, since_ms=claim.claimed_ms - CLOCK_SKEW_MS)


class ReplyFinder(Protocol):
    async def find(self, topic: str, key: bytes, delivery_id: bytes, since_ms: int) -> bool:
        """Whether ``topic`` holds a record with ``key`` and ``HEADER_DELIVERY`` ``delivery_id`` appended after
        ``since_ms`` (epoch ms). Raises KafkaError when it cannot tell."""
        ...


class KafkaReplyFinder:
    """Searches the partition a reply's key maps to (the producer's default partitioner), from ``since_ms`` to the
    end offset read when the search starts. ``consumer``: started, without a group; ``partitions_for``: the
    producer's (one metadata view). One search at a time."""

    def __init__(self, consumer: AIOKafkaConsumer, partitions_for: Callable[[str], Awaitable[set[int]]]) -> None:
        self._consumer = consumer
        self._partitions_for = partitions_for
        self._partitioner = DefaultPartitioner()
        self._lock = asyncio.Lock()

    async def find(self, topic: str, key: bytes, delivery_id: bytes, since_ms: int) -> bool:
        partitions = sorted(await self._partitions_for(topic))
        tp = TopicPartition(topic, self._partitioner(key, partitions, partitions))
        async with self._lock:
            try:
                return await asyncio.wait_for(self._search(tp, key, delivery_id, since_ms), SEARCH_TIMEOUT_S)
            except TimeoutError:
                raise KafkaTimeoutError(f"searching {tp} for a reply took over {SEARCH_TIMEOUT_S} s") from None

    async def _search(self, tp: TopicPartition, key: bytes, delivery_id: bytes, since_ms: int) -> bool:
        consumer = self._consumer
        consumer.assign([tp])
        start = (await consumer.offsets_for_times({tp: max(0, since_ms)}))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if start is None or start.offset >= end:
            return False
        consumer.seek(tp, start.offset)
        wanted = (constants.HEADER_DELIVERY, delivery_id)
        while True:
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if record.offset >= end:
                    return False
                if record.key == key and wanted in record.headers:
                    return True
                if record.offset == end - 1:
                    return False


class DeliveryClaims:
    """Claims and marks on ``constants.delivered_key`` (the delivery's ``delivered_key``) for router ``owner`` (its
    instance id). ``lease_ms``: how long a claimer's produce may take before others may search (the reply tries'
    budget plus a produce request's timeout, twice: aiokafka's bound on one send). ``ttl_ms``: of claims and marks,
    the results' retention. ``finder`` None (tests without a broker): an unmarked claim is taken over unsearched."""

    def __init__(
        self,
        redis: Redis,
        clock: Clock,
        owner: str,
        *,
        lease_ms: int,
        ttl_ms: int,
        finder: ReplyFinder | None = None,
        metrics: RouterMetrics | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._owner = owner
        self._lease_ms = lease_ms
        self._ttl_ms = ttl_ms
        self._finder = finder
        self._metrics = metrics
        self._sleep = sleep
        self._takeover = redis.register_script(_TAKEOVER)

    @staticmethod
    def lease_for(reply_retry_budget_ms: int) -> int:
        return reply_retry_budget_ms + 2 * PRODUCER_REQUEST_TIMEOUT_MS

    async def once(self, key: str, topic: str, reply_key: bytes, produce: Callable[[], Awaitable[object]]):
        """Run ``produce`` unless the reply of delivered key ``key`` went out before (to ``topic`` under
        ``reply_key``); then mark it delivered. Returns what ``produce`` returned, or Step.SKIP."""
        claim = self._claim()
        try:
            found = await self._redis.set(key, claim.encode(), nx=True, get=True, px=self._ttl_ms)
        except ResponseError as exc:  # refused (maxmemory): unclaimed, a redelivery may reply twice; the rest flows
            log.warning("claiming %s was refused: %s", key, exc)
            return Step.SKIP if await self._redis.get(key) == DELIVERED else await self._produce_and_mark(key, produce)
        while True:
            held = Claim.decode(found) if found not in (None, DELIVERED) else None
            alive = held is not None and held.owner != self._owner and await self._alive(held.owner)
            plan = plan_claim(found, self._owner, self._clock.now_ms(), alive)
            if plan.step is Step.SKIP:
                return Step.SKIP
            if plan.step is Step.PRODUCE:
                return await self._produce_and_mark(key, produce)
            if plan.step is Step.WAIT:
                await self._sleep(plan.wait_ms / 1000)
                found = await self._redis.set(key, self._claim().encode(), nx=True, get=True, px=self._ttl_ms)
                continue
            if await self._found(topic, reply_key, key, plan.since_ms):
                await self._mark(key)
                return Step.SKIP
            claim = self._claim()
            taken = await self._takeover(keys=[key], args=[found, claim.encode(), self._ttl_ms])
            found = None if taken else await self._redis.set(key, claim.encode(), nx=True, get=True, px=self._ttl_ms)

    async def _produce_and_mark(self, key: str, produce: Callable[[], Awaitable[object]]):
        outcome = await produce()
        await self._mark(key)
        return outcome

    def _claim(self) -> Claim:
        now_ms = self._clock.now_ms()
        return Claim(self._owner, now_ms, now_ms + self._lease_ms)

    async def _alive(self, owner: str) -> bool:
        return bool(await self._redis.exists(constants.alive_key(ROUTER_SERVICE, owner)))

    async def _found(self, topic: str, reply_key: bytes, key: str, since_ms: int) -> bool:
        found = self._finder is not None and await self._finder.find(topic, reply_key, key.encode(), since_ms)
        if self._metrics is not None:
            self._metrics.reply_searches.labels("found" if found else "not_found").inc()
        log.info("an unmarked claim on %s: the reply %s in %s", key, "was found" if found else "is not", topic)
        return found

    async def _mark(self, key: str) -> None:
        """Answered for good, either way (produced, or dead-lettered): a redelivery does not try again."""
        try:
            await self._redis.set(key, DELIVERED, px=self._ttl_ms)
        except ResponseError as exc:  # refused (maxmemory): the claim stays, so a redelivery searches before replying
            log.warning("marking %s delivered was refused: %s", key, exc)

"""Fencing of batch jobs across regions: every result-router follows the claims on jobs (this region's owners topic
and every configured peer's mirrored here) into the Redis view, and drives or settles a job only while this region's
claim is the highest known (:mod:`llmq_jobs.regions`). Until it has read every owners topic to the end it found at
start, the driver waits: a region that comes back must learn of a takeover before it drives anything. A claim counts
only when it names the region whose topic holds it (this region's in its own, the peer's in the peer's): any other
is not that region's to make, and is dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from llmq_jobs.joblog import owners_topics
from llmq_jobs.jobs import JobOwner
from llmq_jobs.store import JobStore
from llmq_result_router.following import POLL_MS, Follower

log = logging.getLogger(__name__)


class OwnerWatcher(Follower):
    """Follows the owners topics on this cluster (``region``'s own and each of ``peers``' mirrored one) into the
    Redis view; ``caught_up`` is set once it read each one it found at start to the end it had then. ``moved`` is
    called with each claim of a peer that outranked the one known here (the job moved there)."""

    what = "job owners topics"

    def __init__(
        self,
        store: JobStore,
        consumer: AIOKafkaConsumer,
        region: str,
        peers: tuple[str, ...] = (),
        moved: Callable[[JobOwner], None] = lambda claim: None,
    ) -> None:
        super().__init__(consumer)
        self.store = store
        self.region = region
        self.peers = peers
        self.moved = moved
        self.caught_up = asyncio.Event()
        self._topics: dict[str, str] = {}  # topic -> the region its claims must name
        self._ends: dict[TopicPartition, int] = {}

    async def _refresh(self, existing: set[str]) -> None:
        await self._assign(owners_topics(existing, self.region, self.peers))

    async def _poll(self) -> None:
        await self._apply_claims()
        if not self.caught_up.is_set() and await self._reached_ends():
            self.caught_up.set()

    async def _apply_claims(self) -> None:
        """Apply the claims that arrived; with no owners topic yet (nothing claimed anywhere), wait one poll."""
        if not self._topics:
            await asyncio.sleep(POLL_MS / 1000)
            return
        for tp, records in (await self.consumer.getmany(timeout_ms=POLL_MS)).items():
            for record in records:
                if record.value is None:
                    continue
                claim = msgspec.json.decode(record.value, type=JobOwner)
                if claim.region == self._topics.get(tp.topic):
                    if await self.store.owners.raise_owner(claim) and claim.region != self.region:
                        self.moved(claim)
                else:
                    log.warning("dropped a claim of region %r on %s: not that region's topic", claim.region, tp.topic)

    async def _assign(self, topics: dict[str, str]) -> None:
        """Follow ``topics`` from their start (claims are few and applying one twice changes nothing)."""
        if topics == self._topics:
            return
        self._topics = topics
        partitions = [TopicPartition(t, 0) for t in topics]  # one partition each (llmq_jobs.joblog)
        self.consumer.assign(partitions)
        if partitions:
            await self.consumer.seek_to_beginning(*partitions)
        if not self.caught_up.is_set():
            self._ends = await self.consumer.end_offsets(partitions) if partitions else {}

    async def _reached_ends(self) -> bool:
        for tp, end in self._ends.items():
            if await self.consumer.position(tp) < end:
                return False
        return True

"""This region's view of the jobs another region took over: it follows their progress in that region's job topics
mirrored here, so a client asking this region sees what the new owner does (docs/operations/multi-region.md).

A job moved when its highest claim known here is a peer's (:mod:`llmq_result_router.owners`); from then on this
region neither drives nor settles it, and :class:`MovedJobs` shows it as the peer's ``<peer>.llmq.jobs.specs`` and
``<peer>.llmq.jobs.ledger`` have it: the peer's status and times, its ledger's results and the counters they give
(:func:`jobs.result_counts`, as a rebuild counts them), the owner region in the batch object's ``llmq.owner_region``.
Once the peer's record has ended and its ledger holds every line, the view is rebuilt as an ended job
(:func:`regions.restore`): this region's results file, output and error file ids, retention. A job this region ended
itself before it learned of the move keeps its own view.

The peer's records of a job may be mirrored before its claim (the topics are copied independently): when the
owner watcher learns of a move, the peer's topics are read again from their start. Only the jobs moved to a peer
are held in memory (their results: as much as a takeover reads); every router of the region writes the same view.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from llmq_core import wire
from llmq_core.settings import Settings
from llmq_jobs import jobs, regions
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobSnapshot, JobTopics, split_line_key
from llmq_jobs.jobs import JobOwner, JobRecord
from llmq_jobs.store import JobStore
from llmq_result_router.following import POLL_MS, Follower

log = logging.getLogger(__name__)

KINDS = ("specs", "ledger")


@dataclass(slots=True)
class _Moved:
    """What the peer's topics hold of one job moved to it; ``shown``: its whole ledger was written here since it was
    (re)read, so changes alone follow."""

    record: JobRecord | None = None
    results: dict[str, wire.FinalResult] = field(default_factory=dict)
    changed: dict[str, wire.FinalResult | None] = field(default_factory=dict)
    shown: bool = False


def ended(record: JobRecord | None, settled: int) -> bool:
    """Whether the peer's view of a job is its final one: its record has ended and its ledger holds every line (its
    ledger and specs topics are mirrored independently, so either may arrive last). Pure."""
    return record is not None and record.status in jobs.TERMINAL_STATUSES and settled >= record.spec.total


class MovedJobs(Follower):
    """Follows each of ``peers``' mirrored specs and ledger topics into this region's view of the jobs moved there."""

    what = "moved jobs"

    def __init__(
        self, settings: Settings, store: JobStore, files: FileStore, consumer: AIOKafkaConsumer, peers: tuple[str, ...]
    ) -> None:
        super().__init__(consumer)
        self.settings = settings
        self.store = store
        self.files = files
        self.peers = peers
        self._topics: dict[str, tuple[str, str]] = {}  # topic -> (peer, kind)
        self._jobs: dict[str, dict[str, _Moved | None]] = {peer: {} for peer in peers}  # None: not moved there
        self._reread: set[str] = set()

    def moved(self, claim: JobOwner) -> None:
        """The owner watcher learned that ``claim``'s region outranks the claim known here: read its topics again."""
        if claim.region in self._jobs:
            self._reread.add(claim.region)

    async def _poll(self) -> None:
        if self._reread:
            await self._seek_to_start(self._reread)
        if not self._topics:
            await asyncio.sleep(POLL_MS / 1000)
            return
        touched = set()
        for tp, records in (await self.consumer.getmany(timeout_ms=POLL_MS)).items():
            peer, kind = self._topics[tp.topic]
            for record in records:
                touched |= await self._apply(peer, kind, record.key, record.value)
        for peer, batch_id in touched:
            await self._show(peer, batch_id)

    async def _refresh(self, existing: set[str]) -> None:
        topics = {
            JobTopics.mirrored(peer).topic(kind): (peer, kind)
            for peer in self.peers
            for kind in KINDS
            if JobTopics.mirrored(peer).topic(kind) in existing
        }
        if topics == self._topics:
            return
        new = {peer for topic, (peer, _) in topics.items() if topic not in self._topics}
        self._topics = topics
        self.consumer.assign([TopicPartition(t, 0) for t in topics])  # one partition each (llmq_jobs.joblog)
        await self._seek_to_start(new)

    async def _seek_to_start(self, peers: set[str]) -> None:
        """Read ``peers``' topics from their start, deciding again which of their jobs moved there."""
        partitions = [TopicPartition(t, 0) for t, (peer, _) in self._topics.items() if peer in peers]
        for peer in peers:
            self._jobs[peer] = {}
        self._reread -= peers
        if partitions:
            await self.consumer.seek_to_beginning(*partitions)

    async def _apply(self, peer: str, kind: str, key: bytes, value: bytes | None) -> set[tuple[str, str]]:
        """One record of the peer's ``kind`` topic; the (peer, batch id) it changed, if the job moved there."""
        batch_id, custom_id = (key.decode(), "") if kind == "specs" else split_line_key(key)
        job = await self._job(peer, batch_id)
        if job is None:
            return set()
        if kind == "specs":
            job.record = None if value is None else msgspec.json.decode(value, type=JobRecord)
        elif value is None:
            job.results.pop(custom_id, None)
            job.changed[custom_id] = None
        else:
            job.results[custom_id] = job.changed[custom_id] = wire.decode(value)
        return {(peer, batch_id)}

    async def _job(self, peer: str, batch_id: str) -> _Moved | None:
        """The job's state if it moved to ``peer`` (its highest claim here is the peer's) and this region's view of it
        has not ended; decided once per reading of the peer's topics."""
        known = self._jobs[peer]
        if batch_id not in known:
            claim = await self.store.owners.claim(batch_id)
            view = await self.store.jobs.get_job(batch_id) if claim is not None and claim.region == peer else None
            known[batch_id] = _Moved() if view is not None and view.status not in jobs.TERMINAL_STATUSES else None
        return known[batch_id]

    async def _show(self, peer: str, batch_id: str) -> None:
        job = self._jobs[peer][batch_id]
        if ended(job.record, len(job.results)):
            await self._end(peer, batch_id, job)
            return
        record = job.record if job.record is not None and job.record.status in jobs.ACTIVE_STATUSES else None
        changes = job.results if not job.shown else job.changed
        await self.store.jobs.mirror_view(
            batch_id, record, jobs.result_counts(job.results.values()), changes, replace=not job.shown
        )
        job.shown, job.changed = True, {}

    async def _end(self, peer: str, batch_id: str, job: _Moved) -> None:
        """The peer ended the job: rebuild this region's view as an ended job from the peer's record and ledger, then
        forget it (its view is final)."""
        snapshot = JobSnapshot(region=peer, records={batch_id: job.record}, results={batch_id: job.results})
        claim = await self.store.owners.claim(batch_id)
        await regions.restore(self.store, self.files, snapshot, batch_id, claim, self.settings.jobs)
        self._jobs[peer][batch_id] = None
        log.info("batch %s ended %s in region %s", batch_id, job.record.status, peer, extra={"batch_id": batch_id})

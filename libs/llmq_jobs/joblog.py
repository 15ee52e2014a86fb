"""Batch-job state in Kafka: the source of truth that MirrorMaker 2 replicates to the peer region; Redis is its view.

Four compacted topics (constants.JOB_TOPIC_KINDS), one partition each, written before the Redis view changes:

- ``llmq.jobs.specs``: key batch id -> :class:`jobs.JobRecord` (spec, status, times), at create and every status move;
- ``llmq.jobs.lines``: key ``<batch id>:<custom_id>`` -> the line's prepared ``GenerationRequest`` (JSON), at create.
  A line is at most ``LLMQ_BATCH_MAX_LINE_BYTES``, which settings keep under the record limit: a larger line is
  refused at upload (``line_too_large``), never split;
- ``llmq.jobs.ledger``: key ``<batch id>:<custom_id>`` -> the line's terminal ``FinalResult`` (msgpack), before the
  Redis ledger settles it;
- ``llmq.jobs.owners``: key batch id -> :class:`jobs.JobOwner` (region + epoch), at create and at every takeover.

Each has one partition (kafka.topic_layout; MirrorMaker 2 keeps partition counts), partition 0 is the whole topic.

A peer's topics appear here as ``<peer>.llmq.jobs.*`` (DefaultReplicationPolicy): :class:`JobTopics` names either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec
from aiokafka import TopicPartition

from llmq_core import constants, kafka, wire
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.jobs import JobOwner, JobRecord

_json = msgspec.json.encode
READ_POLL_MS = 500  # one fetch while reading a topic to its end


@dataclass(frozen=True, slots=True)
class JobTopics:
    """The job topics of one region as seen from here: ``prefix`` "" for this region's own, ``"<region>."`` for a
    peer's mirrored by MirrorMaker 2 (:meth:`mirrored`)."""

    prefix: str = ""

    @classmethod
    def mirrored(cls, region: str) -> JobTopics:
        return cls(prefix=constants.remote_topic(region, ""))

    def topic(self, kind: str) -> str:
        return f"{self.prefix}{constants.TOPIC_JOBS_PREFIX}{kind}"

    def all(self) -> tuple[str, ...]:
        return tuple(self.topic(kind) for kind in constants.JOB_TOPIC_KINDS)


def line_key(batch_id: str, custom_id: str) -> bytes:
    """The key of a line's records in the lines and ledger topics."""
    return f"{batch_id}:{custom_id}".encode()


def split_line_key(key: bytes) -> tuple[str, str]:
    batch_id, _, custom_id = key.decode().rpartition(":")
    return batch_id, custom_id


class JobLog:
    """Writes a region's job topics; every method returns once the broker acknowledged every record."""

    def __init__(self, producer, topics: JobTopics = JobTopics()) -> None:
        self.producer = producer
        self.topics = topics

    async def put_record(self, record: JobRecord) -> None:
        await self._send("specs", [(record.spec.id.encode(), _json(record))])

    async def put_owner(self, owner: JobOwner) -> None:
        await self._send("owners", [(owner.batch_id.encode(), _json(owner))])

    async def put_lines(self, batch_id: str, requests: Mapping[str, bytes]) -> None:
        """Each line's prepared request (JSON ``GenerationRequest``), by custom_id."""
        await self._send("lines", [(line_key(batch_id, c), r) for c, r in requests.items()])

    async def drop_lines(self, batch_id: str, custom_ids: Iterable[str]) -> None:
        """Tombstones for lines an ended job no longer needs."""
        await self._send("lines", [(line_key(batch_id, c), None) for c in custom_ids])

    async def put_results(self, batch_id: str, results: Mapping[str, wire.FinalResult]) -> None:
        """Terminal results of lines, by custom_id."""
        await self._send("ledger", [(line_key(batch_id, c), wire.encode(r)) for c, r in results.items()])

    async def drop_results(self, batch_id: str, custom_ids: Iterable[str]) -> None:
        """Tombstones for results logged for lines that did not settle with them."""
        await self._send("ledger", [(line_key(batch_id, c), None) for c in custom_ids])

    async def _send(self, kind: str, records: list[tuple[bytes, bytes | None]]) -> None:
        topic = self.topics.topic(kind)
        await asyncio.gather(*(self.producer.send_and_wait(topic, value, key=key) for key, value in records))


@dataclass(slots=True)
class JobSnapshot:
    """What a region's job topics held when read: the latest record of each job, its highest claim, its lines in the
    order written and its settled results."""

    records: dict[str, JobRecord] = field(default_factory=dict)
    owners: dict[str, JobOwner] = field(default_factory=dict)
    lines: dict[str, dict[str, bytes]] = field(default_factory=dict)
    results: dict[str, dict[str, wire.FinalResult]] = field(default_factory=dict)

    def apply(self, kind: str, key: bytes, value: bytes | None) -> None:
        """One record of the ``kind`` topic (a tombstone forgets)."""
        if kind in ("specs", "owners"):
            self._apply_job(kind, key.decode(), value)
            return
        batch_id, custom_id = split_line_key(key)
        table = self.lines if kind == "lines" else self.results
        if value is None:
            table.get(batch_id, {}).pop(custom_id, None)
            return
        table.setdefault(batch_id, {})[custom_id] = value if kind == "lines" else wire.decode(value)

    def _apply_job(self, kind: str, batch_id: str, value: bytes | None) -> None:
        if kind == "specs":
            if value is None:
                self.records.pop(batch_id, None)
            else:
                self.records[batch_id] = msgspec.json.decode(value, type=JobRecord)
        elif value is not None:
            self.owners[batch_id] = jobs.highest(msgspec.json.decode(value, type=JobOwner), self.owners.get(batch_id))


async def read_topics(settings: Settings, topics: JobTopics, kinds: Iterable[str] = constants.JOB_TOPIC_KINDS):
    """Read the ``kinds`` topics of ``topics`` from their start to the end they had when reading began (no consumer
    group, nothing committed); a topic that does not exist (yet) reads as empty."""
    snapshot = JobSnapshot()
    consumer = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        existing = await consumer.topics()
        kind_of = {topics.topic(kind): kind for kind in kinds if topics.topic(kind) in existing}
        partitions = [TopicPartition(t, 0) for t in kind_of]
        if not partitions:
            return snapshot
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        pending = {tp for tp, end in ends.items() if end > 0}
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=READ_POLL_MS)
            for tp, records in batches.items():
                for record in records:
                    if record.offset < ends[tp]:
                        snapshot.apply(kind_of[tp.topic], record.key, record.value)
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
        return snapshot
    finally:
        await consumer.stop()


def owners_topics(topics: Iterable[str]) -> list[str]:
    """Among ``topics``, this region's owners topic and every peer's mirrored here (``<region>.llmq.jobs.owners``)."""
    own = JobTopics().topic("owners")
    return sorted(t for t in topics if t == own or t.endswith(f".{own}"))


def mirrored_regions(topics: Iterable[str]) -> list[str]:
    """The peer regions whose job topics are mirrored here, named by their owners topics among ``topics``."""
    own = JobTopics().topic("owners")
    return [t.removesuffix(f".{own}") for t in owners_topics(topics) if t != own]


async def list_topics(settings: Settings) -> set[str]:
    admin = kafka.make_admin(settings)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()

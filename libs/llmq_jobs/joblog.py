"""Batch-job state in Kafka: the source of truth that MirrorMaker 2 replicates to the peer region; Redis is its view.

Four compacted topics (constants.JOB_TOPIC_KINDS), one partition each, written before the Redis view changes:

- ``llmq.jobs.specs``: key batch id -> :class:`jobs.JobRecord` (spec, status, times), at create and every status move;
- ``llmq.jobs.lines``: key ``<batch id>:<custom_id>`` -> the line's prepared ``GenerationRequest`` (JSON), at create;
  for a line refused at create, its errored ``FinalResult`` (JSON) instead, kept after the job ends as the ledger is.
  A line is at most ``LLMQ_BATCH_MAX_LINE_BYTES``, which settings keep under the record limit: a larger line is
  refused at upload (``line_too_large``), never split;
- ``llmq.jobs.ledger``: key ``<batch id>:<custom_id>`` -> the line's terminal ``FinalResult`` (msgpack), before the
  Redis ledger settles it;
- ``llmq.jobs.owners``: key batch id -> :class:`jobs.JobOwner` (region + epoch), at every takeover. The creating
  region's claim (epoch 0) is the job's id (:func:`jobs.creation_claim`), so a create writes no claim.

API pods write only what a create and a cancel need (specs, lines); claims and settled results are the routers' and
``llmq region``'s (secure clusters: llmq_core.security's ACLs). A claim counts only where it names the region whose
topic holds it, and a peer's only when the peer is configured (``LLMQ_REGION_PEERS``): :meth:`JobSnapshot.apply`,
:func:`owners_topics`.

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
    region: str = ""  # the region these topics are of ("": this one's)

    @classmethod
    def mirrored(cls, region: str) -> JobTopics:
        return cls(prefix=constants.remote_topic(region, ""), region=region)

    def topic(self, kind: str) -> str:
        return f"{self.prefix}{constants.job_topic(kind)}"

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

    async def drop_record(self, batch_id: str) -> None:
        """A tombstone for a deleted job's record: a rebuild from the log no longer brings it back."""
        await self._send("specs", [(batch_id.encode(), None)])

    async def put_owner(self, owner: JobOwner) -> None:
        await self._send("owners", [(owner.batch_id.encode(), _json(owner))])

    async def put_lines(
        self, batch_id: str, requests: Mapping[str, bytes], refused: Mapping[str, wire.FinalResult] = {}
    ) -> None:
        """Each line's prepared request (JSON ``GenerationRequest``), by custom_id; ``refused``: the results of the
        lines refused at create (JSON ``FinalResult``), by custom_id."""
        records = [(line_key(batch_id, c), r) for c, r in requests.items()]
        records += [(line_key(batch_id, c), wire.encode(r, constants.CONTENT_TYPE_JSON)) for c, r in refused.items()]
        await self._send("lines", records)

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
    """What region ``region``'s job topics held when read: the latest record of each job, its highest claim (that
    region's own claims, and its creation claim for a job it created), its lines in the order written and its
    settled results (those refused at create among them)."""

    region: str
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
        elif kind == "ledger":
            self.results.setdefault(batch_id, {})[custom_id] = wire.decode(value)
        elif _tag(value) == _RESULT_TAG:  # refused at create: settled then (a ledger record of it would win)
            self.results.setdefault(batch_id, {}).setdefault(custom_id, wire.decode(value))
        else:
            self.lines.setdefault(batch_id, {})[custom_id] = value

    def _apply_job(self, kind: str, batch_id: str, value: bytes | None) -> None:
        if kind == "specs":
            if value is None:
                self.records.pop(batch_id, None)
                return
            self.records[batch_id] = msgspec.json.decode(value, type=JobRecord)
            claim = jobs.creation_claim(batch_id)
        else:
            claim = None if value is None else msgspec.json.decode(value, type=JobOwner)
        if claim is not None and claim.region == self.region:  # any other is forged, or not this region's to make
            self.owners[batch_id] = jobs.highest(claim, self.owners.get(batch_id))


class _Tagged(msgspec.Struct):
    type: str = ""


_RESULT_TAG = "final_result"


def _tag(value: bytes) -> str:
    """The wire tag of a JSON message (the rest is skipped, not decoded); "" for anything else."""
    try:
        return msgspec.json.decode(value, type=_Tagged).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


async def read_topics(settings: Settings, topics: JobTopics, kinds: Iterable[str] = constants.JOB_TOPIC_KINDS):
    """Read the ``kinds`` topics of ``topics`` from their start to the end they had when reading began (no consumer
    group, nothing committed); a topic that does not exist (yet) reads as empty."""
    snapshot = JobSnapshot(region=topics.region or settings.region.name)
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


def owners_topics(topics: Iterable[str], own_region: str, peers: Iterable[str]) -> dict[str, str]:
    """Among ``topics``, this region's owners topic and the one of each of ``peers`` mirrored here
    (``<peer>.llmq.jobs.owners``; a region not among them is ignored): topic -> the region its claims must name."""
    own = JobTopics().topic("owners")
    regions = {own: own_region} | {JobTopics.mirrored(peer).topic("owners"): peer for peer in peers}
    return {topic: regions[topic] for topic in sorted(topics) if topic in regions}


def mirrored_regions(topics: Iterable[str], peers: Iterable[str]) -> list[str]:
    """Those of ``peers`` whose job topics are mirrored here, named by their owners topics among ``topics``."""
    present = set(topics)
    return [peer for peer in peers if JobTopics.mirrored(peer).topic("owners") in present]


async def list_topics(settings: Settings) -> set[str]:
    admin = kafka.make_admin(settings)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()

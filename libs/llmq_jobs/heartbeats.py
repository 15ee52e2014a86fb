"""Whether a peer region would learn of a takeover: the heartbeats of its inbound MirrorMaker 2, as seen here.

MirrorMaker 2's heartbeat connector of the flow ``b -> a`` (run by a's MirrorMaker 2) writes a heartbeat (source
``b``, target ``a``, its epoch ms) every ``emit.heartbeats.interval.seconds`` (1 s) to the ``heartbeats`` topic of
a's cluster; the flow ``a -> b`` copies that topic into b as ``a.heartbeats`` (heartbeats topics are mirrored whatever
the topics filter: ``heartbeats.replication.enabled``, true by default). So b finds in ``a.heartbeats`` when a's
inbound mirror last wrote into a: a fresh one means a's MirrorMaker 2 runs and reaches a's cluster (and a's reaches
back here); a stale or missing one means it is stopped or behind, a is unreachable, or a is lost. A heartbeat says
the mirror runs, not that every topic of it has caught up (its replication tasks could lag while it beats).

:func:`decide` is the pure decision; :func:`heartbeats_ms` reads Kafka.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import TopicPartition

from llmq_core import constants, kafka
from llmq_core.settings import Settings

TAIL_RECORDS = 200  # heartbeats read from the end: every flow into the peer beats once a second
_INT16, _INT64 = struct.Struct(">h"), struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    source: str
    target: str
    at_ms: int


def parse_heartbeat(key: bytes | None, value: bytes | None) -> Heartbeat | None:
    """MirrorMaker 2's heartbeat record (``org.apache.kafka.connect.mirror.Heartbeat``): key = source alias and
    target alias, each an int16 length and UTF-8; value = an int16 version (0), then the int64 epoch ms, big-endian.
    None for anything else."""
    try:
        source, rest = _string(key or b"")
        target, rest = _string(rest)
        (version,) = _INT16.unpack_from(value or b"")
        (at_ms,) = _INT64.unpack_from(value or b"", _INT16.size)
    except (struct.error, UnicodeDecodeError):
        return None
    if rest or version != 0:
        return None
    return Heartbeat(source, target, at_ms)


def _string(data: bytes) -> tuple[str, bytes]:
    (size,) = _INT16.unpack_from(data)
    end = _INT16.size + size
    if size < 0 or end > len(data):
        raise struct.error("string past the end")
    return data[_INT16.size : end].decode(), data[end:]


@dataclass(frozen=True, slots=True)
class Verdict:
    """``allowed``: the peer's inbound mirror beat recently enough; ``reason`` says what was seen."""

    allowed: bool
    reason: str


def decide(heartbeats_ms: Iterable[int], now_ms: int, max_age_ms: int, *, flow: str, topic: str) -> Verdict:
    """Whether a failover may go ahead, from the epoch ms of the heartbeats of ``flow`` (``"b->a"``, the peer's
    inbound mirror) found in ``topic``: the newest must be at most ``max_age_ms`` old at ``now_ms`` (one from the
    future, a clock ahead of ours, counts as fresh)."""
    newest = max(heartbeats_ms, default=None)
    if newest is None:
        return Verdict(False, f"no heartbeat of MirrorMaker 2 {flow} in {topic}")
    age_ms = now_ms - newest
    seen = f"the newest heartbeat of MirrorMaker 2 {flow} in {topic} is {age_ms / 1000:.1f} s old"
    if age_ms > max_age_ms:
        return Verdict(False, f"{seen} (more than {max_age_ms / 1000:g} s)")
    return Verdict(True, seen)


def heartbeats_topic(peer: str) -> str:
    """Where the peer's ``heartbeats`` topic is mirrored here: ``<peer>.heartbeats``."""
    return constants.remote_topic(peer, constants.TOPIC_MM2_HEARTBEATS)


async def heartbeats_ms(settings: Settings, topic: str, source: str, target: str) -> list[int]:
    """The epoch ms of the heartbeats of flow ``source -> target`` among the last :data:`TAIL_RECORDS` records of
    ``topic`` on this region's cluster; [] when the topic does not exist. MirrorMaker 2 creates its heartbeats topic
    with one partition (compacted), and a mirrored topic keeps its partition count: partition 0 is all of it."""
    consumer = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        start, end = (await consumer.beginning_offsets([tp]))[tp], (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, max(start, end - TAIL_RECORDS))
        found = []
        while await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                beat = parse_heartbeat(record.key, record.value)
                if beat is not None and (beat.source, beat.target) == (source, target):
                    found.append(beat.at_ms)
        return found
    finally:
        await consumer.stop()

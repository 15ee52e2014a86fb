"""Whether Kafka topics exist, from cached listings of the cluster's topics: the result-router's reply topics (it
dead-letters a reply to a missing one at once) and the batcher's entry check of a Kafka-direct request's reply topic
(refused before anything is computed). Free of I/O: the callers list the topics and read their injected clock."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from llmq_core.clock import Clock

DENIED = "authorization failed (no ACL lets this router write it: LLMQ_KAFKA_REPLY_TOPIC_PREFIXES, docs/security.md)"


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A reply that will not be sent: ``reason`` for the dead letter, ``kind`` for the metric (``missing_topic``,
    ``refused``, ``retries``); ``topic_wide`` when the topic itself failed."""

    reason: str
    kind: str
    topic_wide: bool = False


class Presence(enum.Enum):
    EXISTS = "exists"
    MISSING = "missing"
    UNKNOWN = "unknown"  # not in the view, which is older than the result: list the topics again


class TopicView:
    """The cluster's topics as of the last listing. A reply topic is created before its request is produced (the
    broker does not create topics on demand), so before its result reaches the router: a listing asked for after the
    router received the result that lacks the topic shows it missing. Listings are at most one per ``refresh_ms``.
    ``secure``: the cluster has ACLs, so a listing leaves out the topics this router may not write (the broker does
    not tell them from missing ones)."""

    def __init__(self, clock: Clock, refresh_ms: int, secure: bool = False) -> None:
        self.clock = clock
        self.refresh_ms = refresh_ms
        self.secure = secure
        self._topics: frozenset[str] = frozenset()
        self._listed_ms: int | None = None  # when the last listing was asked for

    def presence(self, topic: str, received_ms: int) -> Presence:
        """Whether ``topic`` exists, for a result the router received at ``received_ms``."""
        if topic in self._topics:
            return Presence.EXISTS
        if self._listed_ms is not None and self._listed_ms >= received_ms:
            return Presence.MISSING
        return Presence.UNKNOWN

    def wait_ms(self) -> int:
        """How long until the next listing may be asked for."""
        if self._listed_ms is None:
            return 0
        return max(0, self._listed_ms + self.refresh_ms - self.clock.now_ms())

    def update(self, topics: Iterable[str], listed_ms: int) -> None:
        """The topics of a listing asked for at ``listed_ms``."""
        self._topics, self._listed_ms = frozenset(topics), listed_ms

    def forget(self, topic: str) -> None:
        """``topic`` failed as a whole (deleted since the listing): missing until a listing shows it again."""
        self._topics -= {topic}

    def missing(self, topic: str) -> GiveUp:
        age_ms = self.clock.now_ms() - (self._listed_ms or 0)
        what = f"does not exist or {DENIED}" if self.secure else "does not exist"
        return GiveUp(
            reason=f"reply topic {topic!r} {what} (not among the cluster's topics listed {age_ms} ms ago)",
            kind="missing_topic",
            topic_wide=True,
        )

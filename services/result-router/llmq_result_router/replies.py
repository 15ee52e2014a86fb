"""Producing a result to its Kafka reply topic: whether the topic exists, which failures get another try, how long
to wait, when to give up, which failures get a log line.

Free of I/O: the loop lists topics, produces, sleeps and reads its injected clock. Whether a reply topic exists is
read from one cached listing of the cluster's topics (:class:`TopicView`), so a reply to a missing topic is
dead-lettered at once whatever its name: a producer that invents names costs one listing per ``refresh_ms``, not a
retry window per name. Only a reply to a topic that exists is tried again (leader elections, broker blips), within
``budget_ms`` per result and for at most ``max_streak`` results in a row per partition. A reply that ends unsent is
dead-lettered, so the results behind it on its partition keep flowing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import errors

from llmq_core.clock import Clock
from llmq_core.kafka import RECORD_REFUSED_ERRORS
from llmq_core.settings import Settings

# Failures of the topic itself, not of one record: the topic is dropped from the view until the next listing.
TOPIC_ERRORS: tuple[type[Exception], ...] = (
    errors.UnknownTopicOrPartitionError,
    errors.TopicAuthorizationFailedError,
    errors.InvalidTopicError,
)

_DENIED = "authorization failed (no ACL lets this router write it: LLMQ_KAFKA_REPLY_TOPIC_PREFIXES, docs/security.md)"
LOG_WINDOW_MS = 10_000  # reply failures: one log line per topic per window ...
LOG_MAX_LINES = 20  # ... and this many lines per window in all (fresh names each get a key)


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
        what = f"does not exist or {_DENIED}" if self.secure else "does not exist"
        return GiveUp(
            reason=f"reply topic {topic!r} {what} (not among the cluster's topics listed {age_ms} ms ago)",
            kind="missing_topic",
            topic_wide=True,
        )


@dataclass(frozen=True, slots=True)
class ReplyRetry:
    """Up to ``attempts`` tries of one reply to a topic that exists, try n+1 after ``backoff_ms * 2**(n-1)``, all
    within ``budget_ms`` of the first; no retries once ``max_streak`` results in a row on the partition ended unsent
    after theirs (a broker outage does not hold a partition budget_ms per result)."""

    attempts: int
    backoff_ms: int
    budget_ms: int
    max_streak: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplyRetry:
        return cls(
            attempts=settings.router.reply_attempts,
            backoff_ms=settings.router.reply_backoff_ms,
            budget_ms=settings.router.reply_retry_budget_ms,
            max_streak=settings.router.reply_retry_streak_max,
        )

    def wait_ms(self, error: Exception, failures: int, elapsed_ms: int, streak: int) -> int | None:
        """The wait before the next try after failure number ``failures`` (1-based) with ``error``, ``elapsed_ms``
        after the first try began, ``streak`` results in a row on this partition having ended unsent after retries;
        None: give up."""
        if isinstance(error, RECORD_REFUSED_ERRORS) or failures >= self.attempts or streak >= self.max_streak:
            return None
        wait_ms = self.backoff_ms * 2 ** (failures - 1)
        return wait_ms if elapsed_ms + wait_ms < self.budget_ms else None

    def try_timeout_ms(self, elapsed_ms: int, metadata_timeout_ms: int) -> int:
        """How long one try may wait for the topic's partitions: what is left of the budget, at most the setting."""
        return max(1, min(metadata_timeout_ms, self.budget_ms - elapsed_ms))


def give_up(topic: str, error: Exception, failures: int, elapsed_ms: int) -> GiveUp:
    """Why a reply to ``topic`` ended unsent after ``failures`` tries over ``elapsed_ms``."""
    what = _FAILURES.get(type(error), "failed")
    reason = (
        f"reply topic {topic!r} {what}: {type(error).__name__}: {error} "
        f"({failures} {'try' if failures == 1 else 'tries'} in {elapsed_ms} ms)"
    )
    kind = "refused" if isinstance(error, RECORD_REFUSED_ERRORS) else "retries"
    return GiveUp(reason=reason, kind=kind, topic_wide=isinstance(error, TOPIC_ERRORS))


_FAILURES = {
    errors.UnknownTopicOrPartitionError: "does not exist",
    errors.TopicAuthorizationFailedError: f"was refused: {_DENIED}",
}


class LogGate:
    """Whether a line may be logged: one per key per ``window_ms``, ``max_lines`` per window in all."""

    def __init__(self, clock: Clock, window_ms: int = LOG_WINDOW_MS, max_lines: int = LOG_MAX_LINES) -> None:
        self.clock = clock
        self.window_ms = window_ms
        self.max_lines = max_lines
        self._keys: set[str] = set()
        self._window_end_ms = 0

    def allow(self, key: str) -> bool:
        now_ms = self.clock.now_ms()
        if now_ms >= self._window_end_ms:
            self._keys, self._window_end_ms = set(), now_ms + self.window_ms
        if key in self._keys or len(self._keys) >= self.max_lines:
            return False
        self._keys.add(key)
        return True

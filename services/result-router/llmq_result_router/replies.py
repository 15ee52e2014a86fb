"""Producing a result to its Kafka reply topic: which failures get another try, how long to wait, when to give up.

Free of I/O: the loop produces, sleeps and reads its injected clock. A reply is tried at most ``attempts`` times;
a permanent error (the topic is refused by the broker, the record can never fit) ends it at once. A reply that ends
unsent is dead-lettered, so the results behind it on its partition keep flowing. A topic that failed as a whole
(missing, unauthorized) is remembered for a while, so its next results are dead-lettered without another retry window.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from aiokafka import errors

from llmq_core.clock import Clock
from llmq_core.kafka import RECORD_REFUSED_ERRORS
from llmq_core.settings import Settings

# Failures of the topic itself, not of one record: every result for it would fail the same way.
TOPIC_ERRORS: tuple[type[Exception], ...] = (
    errors.UnknownTopicOrPartitionError,
    errors.TopicAuthorizationFailedError,
    errors.InvalidTopicError,
)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A reply that will not be sent: ``reason`` for the dead letter; ``topic_wide`` when the topic itself failed."""

    reason: str
    topic_wide: bool


@dataclass(frozen=True, slots=True)
class ReplyRetry:
    """Up to ``attempts`` tries of one reply, try n+1 after ``backoff_ms * 2**(n-1)``."""

    attempts: int
    backoff_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplyRetry:
        return cls(attempts=settings.router_reply_attempts, backoff_ms=settings.router_reply_backoff_ms)

    def wait_ms(self, error: Exception, failures: int) -> int | None:
        """The wait before the next try after failure number ``failures`` (1-based) with ``error``; None: give up."""
        if isinstance(error, RECORD_REFUSED_ERRORS) or failures >= self.attempts:  # no retry changes those
            return None
        return self.backoff_ms * 2 ** (failures - 1)


def give_up(topic: str, error: Exception, failures: int, elapsed_ms: int) -> GiveUp:
    """Why a reply to ``topic`` ended unsent after ``failures`` tries over ``elapsed_ms``."""
    what = "does not exist" if isinstance(error, errors.UnknownTopicOrPartitionError) else "failed"
    reason = (f"reply topic {topic!r} {what}: {type(error).__name__}: {error} "
              f"({failures} {'try' if failures == 1 else 'tries'} in {elapsed_ms} ms)")
    return GiveUp(reason=reason, topic_wide=isinstance(error, TOPIC_ERRORS))


class UnreachableTopics:
    """Reply topics that failed as a whole within the last ``ttl_ms`` (at most ``max_topics``, oldest forgotten first),
    so that one missing topic costs one retry window per ``ttl_ms``, not one per result."""

    def __init__(self, clock: Clock, ttl_ms: int, max_topics: int = 1024) -> None:
        self.clock = clock
        self.ttl_ms = ttl_ms
        self.max_topics = max_topics
        self._until: OrderedDict[str, tuple[int, str]] = OrderedDict()  # topic -> (forget at ms, reason)

    def mark(self, topic: str, reason: str) -> None:
        self._until.pop(topic, None)
        self._until[topic] = (self.clock.now_ms() + self.ttl_ms, reason)
        while len(self._until) > self.max_topics:
            self._until.popitem(last=False)

    def reason(self, topic: str) -> str | None:
        """Why ``topic`` failed, while that is remembered; None otherwise."""
        entry = self._until.get(topic)
        if entry is None:
            return None
        until_ms, reason = entry
        if self.clock.now_ms() >= until_ms:
            del self._until[topic]
            return None
        return f"{reason}; not retried for {self.ttl_ms} ms"

"""Producing a result to its Kafka reply topic: whether the topic exists, which failures get another try, how long
to wait, when to give up, which failures get a log line.

Free of I/O: the loop lists topics, produces, sleeps and reads its injected clock. Whether a reply topic exists is
read from one cached listing of the cluster's topics (:class:`llmq_core.topics.TopicView`), so a reply to a missing topic is
dead-lettered at once whatever its name: a producer that invents names costs one listing per ``refresh_ms``, not a
retry window per name. Only a reply to a topic that exists is tried again (leader elections, broker blips), within
``budget_ms`` per result and for at most ``max_streak`` results in a row per partition. A reply that ends unsent is
dead-lettered, so the results behind it on its partition keep flowing.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import errors

from llmq_core.clock import Clock
from llmq_core.kafka import RECORD_REFUSED_ERRORS
from llmq_core.settings import Settings
from llmq_core.topics import DENIED, GiveUp

# Failures of the topic itself, not of one record: the topic is dropped from the view until the next listing.
TOPIC_ERRORS: tuple[type[Exception], ...] = (
    errors.UnknownTopicOrPartitionError,
    errors.TopicAuthorizationFailedError,
    errors.InvalidTopicError,
)

LOG_WINDOW_MS = 10_000  # reply failures: one log line per topic per window ...
LOG_MAX_LINES = 20  # ... and this many lines per window in all (fresh names each get a key)


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
    errors.TopicAuthorizationFailedError: f"was refused: {DENIED}",
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

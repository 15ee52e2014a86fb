"""What the pod knows of its shared dependencies (Kafka, Redis), and the circuit breaker in front of its Kafka producer.

Pure: the clock is injected and nothing here does I/O; the producer, the gateway and the replies listener report what
they see. While the breaker is open, new requests get 503 + Retry-After at once instead of each waiting the produce
timeout on a broker known to be failing:

- closed: requests are produced. A failed or timed-out produce opens the breaker for ``backoff_ms``.
- open: requests are refused. Once the backoff has passed, the next request is let through as a probe (half-open).
- half-open: the probe is in flight; other requests are still refused. Its success closes the breaker, its failure
  opens it again for twice the previous backoff (at most ``max_backoff_ms``). A probe that never reports (its client
  left) is replaced after ``probe_timeout_ms``.

Any acknowledged produce closes the breaker (Kafka works), so it also closes on its own when the producer recovers.
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmq_core.clock import Clock

UP, DOWN, STARTING = "up", "down", "starting"
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
KAFKA, REDIS = "kafka", "redis"


class Dependency:
    """One dependency's state (``starting`` until first known, then ``up`` / ``down``), since when (epoch ms), and
    why it is down. ``ever_up``: it has been up at least once since the pod started."""

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self._clock = clock
        self.state = STARTING
        self.since_ms = clock.now_ms()
        self.reason: str | None = None
        self.ever_up = False

    @property
    def up(self) -> bool:
        return self.state == UP

    def mark(self, up: bool, reason: str | None = None) -> None:
        """Record the state seen now; ``since_ms`` moves only when the state changes."""
        state = UP if up else DOWN
        if state != self.state:
            self.state, self.since_ms = state, self._clock.now_ms()
        self.reason = None if up else reason
        self.ever_up = self.ever_up or up

    def describe(self) -> dict:
        since = datetime.fromtimestamp(self.since_ms / 1000, UTC).isoformat(timespec="milliseconds")
        return {
            "state": self.state,
            "since": since.replace("+00:00", "Z"),
            "since_ms": self.since_ms,
            "reason": self.reason,
        }


class CircuitBreaker:
    """The breaker of the module doc; ``dependency`` is marked down when it opens and up when it closes."""

    def __init__(
        self, dependency: Dependency, clock: Clock, *, backoff_ms: int, max_backoff_ms: int, probe_timeout_ms: int
    ) -> None:
        self.dependency = dependency
        self._clock = clock
        self._base_backoff_ms = backoff_ms
        self._max_backoff_ms = max(backoff_ms, max_backoff_ms)
        self._probe_timeout_ms = probe_timeout_ms
        self._backoff_ms = backoff_ms
        self._until_ms = 0  # open: when the next probe may go; half-open: when the probe in flight is given up on
        self._succeeded_ms = -1  # when an attempt last succeeded
        self.state = CLOSED

    def allow(self) -> bool:
        """Whether a request may be produced now; in open state past the backoff it becomes the probe."""
        if self.state == CLOSED:
            return True
        now_ms = self._clock.now_ms()
        if now_ms < self._until_ms:
            return False
        self.state, self._until_ms = HALF_OPEN, now_ms + self._probe_timeout_ms
        return True

    def retry_after_ms(self) -> int:
        """How long a refused request should wait: until the next probe may go (or the one in flight must end)."""
        return max(0, self._until_ms - self._clock.now_ms()) if self.state != CLOSED else 0

    def succeeded(self) -> None:
        self.state, self._backoff_ms = CLOSED, self._base_backoff_ms
        self._succeeded_ms = self._clock.now_ms()
        self.dependency.mark(True)

    def failed(self, reason: str, started_ms: int | None = None) -> None:
        """A produce failed or timed out (or the producer could not start): open, or stay open. The failure of an
        attempt that started before the last success (``started_ms``: a produce sent during an outage that ends after
        the recovery) says nothing about now and is ignored."""
        if started_ms is not None and started_ms < self._succeeded_ms:
            return
        if self.state == OPEN:
            self.dependency.mark(False, reason)
            return
        if self.state == HALF_OPEN:
            self._backoff_ms = min(2 * self._backoff_ms, self._max_backoff_ms)
        self.state, self._until_ms = OPEN, self._clock.now_ms() + self._backoff_ms
        self.dependency.mark(False, reason)


def report(dependencies: list[Dependency], draining: bool) -> tuple[bool, dict]:
    """(ready, body) of ``/readyz``.

    Ready once every dependency has been up since the pod started, and until it drains. A shared dependency that
    fails later leaves the pod ready on purpose (it would fail every pod of the Service at once, and requests get a
    fast 503 with Retry-After meanwhile): the body then says ``degraded`` and names it.
    """
    failing = [d.name for d in dependencies if not d.up]
    started = all(d.ever_up for d in dependencies)
    status = "draining" if draining else "starting" if not started else "degraded" if failing else "ok"
    return started and not draining, {"ready": started and not draining, "status": status, "failing": failing}


def dependencies_report(dependencies: list[Dependency]) -> tuple[bool, dict]:
    """(all up, body) of ``/dependencies``: each dependency's state, since when and why it is down."""
    healthy = all(d.up for d in dependencies)
    return healthy, {
        "status": "ok" if healthy else "degraded",
        "dependencies": {d.name: d.describe() for d in dependencies},
    }

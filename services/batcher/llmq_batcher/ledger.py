"""One worker's capacity ledger, shared by every batcher of the fleet: a worker's room is handed out once.

Every batcher hears every worker's heartbeats but sees only its own batches, so on its own it cannot tell what other
batchers sent a worker since its last heartbeat. The ledger can: the worker writes what it holds (``running``,
``queued``) each time that changes, and removes a batch's grant when it takes the batch; a batcher claims a batch's
requests before producing it. The room a claim can get:

- a fixed-time engine: what its next window has left, ``max_slots - queued - in transit`` (one window queued at
  most: a batch that waited longer would be better kept in its batcher, where it can still be re-ordered), and only
  from ``lead_ms`` until ``margin_ms`` before the running window ends (``ends_ms``, which the worker writes when a
  window starts; a claim on an idle worker starts one at once, and predicts its end). Outside that, nothing: the
  claim learns which window to come back for;
- a continuous-batching engine: ``max_slots + queue_bound - running - queued - in transit``; for a batch that holds
  no deferred request (``urgent``), also its ``preemptible``: running deferred sequences the worker would preempt for
  such work (the worker writes it; 0 when it never preempts, or an older worker that does not write it).

All rooms are floored at 0.

In transit are the grants not yet taken, each for at most ``grant_ttl_ms`` (a batch that never reached its worker, or
a killed batcher's, stops counting then).

This class is the rule; the batcher runs it in Redis (capacity.py, one Lua script per call) and the simulator in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Grant:
    """A claim's answer: ``granted`` of the requests asked for; for a fixed-time worker, the next window a batch may
    still be claimed for, ``next_ms`` (epoch ms) with ``next_room`` (0, 0 for a continuous-batching one)."""

    granted: int
    next_ms: int = 0
    next_room: int = 0


@dataclass(slots=True)
class WorkerLedger:
    """What one worker's ledger holds. ``grants``: batch_id -> (requests granted, expires epoch ms)."""

    max_slots: int
    fixed: bool
    batch_time_ms: int = 0  # fixed-time engines
    queue_bound: int = 0
    running: int = 0
    queued: int = 0
    preemptible: int = 0  # continuous-batching engines: room urgent claims get beyond the rest
    ends_ms: int = 0  # fixed-time engines: when the running window ends (as predicted, until the worker says)
    grants: dict[str, tuple[int, int]] = field(default_factory=dict)

    def room(self, now_ms: int, urgent: bool = False) -> int:
        """Requests a claim at ``now_ms`` could be granted, its timing aside; ``urgent``: for a batch without deferred
        requests (a continuous-batching worker's preemptible room counts too)."""
        self.grants = {b: g for b, g in self.grants.items() if g[1] > now_ms}
        in_transit = sum(n for n, _ in self.grants.values())
        if self.fixed:
            return max(self.max_slots - self.queued - in_transit, 0)
        preemptible = self.preemptible if urgent else 0
        return max(self.max_slots + self.queue_bound + preemptible - self.running - self.queued - in_transit, 0)

    def claim(
        self,
        batch_id: str,
        requests: int,
        now_ms: int,
        grant_ttl_ms: int,
        lead_ms: int = 0,
        margin_ms: int = 0,
        urgent: bool = False,
    ) -> Grant:
        """Grant ``batch_id`` up to ``requests``: a fixed-time worker's next window takes claims from ``lead_ms`` (the
        batcher's largest class lead) until ``margin_ms`` (a batch's way to the worker) before it starts. ``urgent``:
        the batch holds no deferred request (it may take a continuous-batching worker's preemptible room)."""
        room = self.room(now_ms, urgent)
        if not self.fixed:
            return Grant(self._grant(batch_id, min(requests, room), now_ms, grant_ttl_ms))
        if not (self.running or self.queued or self.grants) or self.ends_ms <= now_ms:  # idle: this batch starts one
            self.ends_ms = now_ms + self.batch_time_ms
            return Grant(self._grant(batch_id, min(requests, room), now_ms, grant_ttl_ms), self.ends_ms, self.max_slots)
        if now_ms < self.ends_ms - lead_ms:
            return Grant(0, self.ends_ms, room)
        if now_ms > self.ends_ms - margin_ms:  # it would arrive after the window started: the next one's turn
            return Grant(0, self.ends_ms + self.batch_time_ms, self.max_slots)
        granted = self._grant(batch_id, min(requests, room), now_ms, grant_ttl_ms)
        if granted < room:
            return Grant(granted, self.ends_ms, room - granted)
        return Grant(granted, self.ends_ms + self.batch_time_ms, self.max_slots)

    def _grant(self, batch_id: str, granted: int, now_ms: int, grant_ttl_ms: int) -> int:
        if granted > 0:
            self.grants[batch_id] = (granted, now_ms + grant_ttl_ms)
        return granted

    def release(self, batch_id: str) -> None:
        """The grant of a batch that will not be produced goes back."""
        self.grants.pop(batch_id, None)

    def took(self, batch_id: str, running: int, queued: int, preemptible: int = 0) -> None:
        """The worker took ``batch_id`` (its grant is no longer in transit) and now holds this."""
        self.grants.pop(batch_id, None)
        self.holds(running, queued, preemptible=preemptible)

    def holds(self, running: int, queued: int, ends_ms: int = 0, preemptible: int = 0) -> None:
        """The worker's requests now: running and queued, when its running window ends, and how many of its running
        deferred sequences it would preempt (it writes these as they change)."""
        self.running, self.queued, self.preemptible = running, queued, preemptible
        if ends_ms:
            self.ends_ms = ends_ms

"""The requests the batching policy holds, one :class:`Entry` each, and the one place their state changes.

An entry moves NEW -> QUEUED -> DISPATCHED -> DONE, or leaves the queue for DONE without dispatch (cancel, expiry, a
result seen). :meth:`EntryTable.transition` makes every move and keeps the counts the policy decides by (queued,
in flight, in flight per tenant, batches with work still in flight), so no caller can let them drift.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from llmq_core import wire


class EntryState(enum.Enum):
    NEW = "new"  # built, not held yet
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    DONE = "done"  # no longer held: dispatched and finished, handed back, or left the queue


# Bound once: enum member lookups cost ~0.5 us on 3.11, and these are compared on every queue operation.
NEW, QUEUED, DISPATCHED, DONE = EntryState.NEW, EntryState.QUEUED, EntryState.DISPATCHED, EntryState.DONE


class Entry:
    """One request as the policy holds it. ``cost`` is estimated tokens; ``cls`` indexes CLASS_KEYS; ``size_bytes`` is
    what the request adds to a Batch record (measured once, on arrival); ``flight``: its batch once dispatched;
    ``chains``: its prefix chain, [not tenant-scoped, tenant-scoped], each hashed when first needed (prefix_route.py)."""

    __slots__ = (
        "request",
        "seq",
        "cls",
        "tenant",
        "cost",
        "size_bytes",
        "tag",
        "enqueued_ms",
        "state",
        "flight",
        "chains",
    )

    def __init__(
        self, request: wire.GenerationRequest, seq: int, cls: int, cost: int, size_bytes: int, enqueued_ms: int
    ) -> None:
        self.request = request
        self.seq = seq
        self.cls = cls
        self.tenant = request.tenant_id
        self.cost = cost
        self.size_bytes = size_bytes
        self.tag = 0.0
        self.enqueued_ms = enqueued_ms
        self.state = NEW
        self.flight: Flight | None = None
        self.chains: list[tuple[int, ...] | None] | None = None


class Flight:
    """The entries of one batch dispatched to ``worker_id``; ``live`` counts those not finished yet (``entries`` is
    dropped at 0). Entries board it as they are dispatched and land when they finish."""

    __slots__ = ("worker_id", "entries", "live")

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.entries: list[Entry] | None = []
        self.live = 0

    def board(self, entry: Entry) -> bool:
        """Add a just-dispatched entry; True when it is the first (the flight became live)."""
        self.entries.append(entry)
        self.live += 1
        return self.live == 1

    def land(self) -> bool:
        """One of its entries finished; True when it was the last (the flight is over)."""
        self.live -= 1
        if self.live:
            return False
        self.entries = None
        return True


class EntryTable:
    """The entries held (QUEUED or DISPATCHED) by request id, and their counts: ``queued``, ``inflight``,
    ``live_flights`` and in flight per tenant. Only :meth:`transition` changes them."""

    __slots__ = ("_held", "_tenant_inflight", "queued", "inflight", "live_flights")

    def __init__(self) -> None:
        self._held: dict[str, Entry] = {}
        self._tenant_inflight: dict[str, int] = {}
        self.queued = 0
        self.inflight = 0
        self.live_flights = 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def get(self, request_id: str) -> Entry | None:
        return self._held.get(request_id)

    def held(self) -> Iterable[Entry]:
        return self._held.values()

    def tenant_inflight(self, tenant: str) -> int:
        return self._tenant_inflight.get(tenant, 0)

    def transition(self, entry: Entry, state: EntryState, flight: Flight | None = None) -> None:
        """Move ``entry`` to ``state`` (DISPATCHED: aboard ``flight``) and count it. Moves: NEW -> QUEUED (one entry per
        request id), QUEUED -> DISPATCHED, QUEUED -> DONE, DISPATCHED -> DONE; any other raises ValueError."""
        old = entry.state
        request_id = entry.request.request_id
        if old is NEW and state is QUEUED and request_id not in self._held:
            self._held[request_id] = entry
            self.queued += 1
        elif old is QUEUED and state is DISPATCHED and flight is not None:
            self.queued -= 1
            self.inflight += 1
            self._tenant_inflight[entry.tenant] = self._tenant_inflight.get(entry.tenant, 0) + 1
            entry.flight = flight
            self.live_flights += flight.board(entry)
        elif old is QUEUED and state is DONE:
            self.queued -= 1
            del self._held[request_id]
        elif old is DISPATCHED and state is DONE:
            self.inflight -= 1
            del self._held[request_id]
            count = self._tenant_inflight[entry.tenant] - 1
            if count:
                self._tenant_inflight[entry.tenant] = count
            else:
                del self._tenant_inflight[entry.tenant]
            self.live_flights -= entry.flight.land()
        else:
            raise ValueError(f"request {request_id}: no move from {old.name} to {state.name}")
        entry.state = state

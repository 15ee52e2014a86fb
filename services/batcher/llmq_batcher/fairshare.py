"""Weighted fair queueing across tenants inside one (model, class) queue: start-time fair queueing (SFQ).

Each tenant has a FIFO lane. A request gets a start tag ``S = max(V, F_prev)`` and its lane's finish tag becomes
``F = S + cost / weight``; the queue serves the lowest start tag and moves the virtual time ``V`` to it. A tenant with
10,000 queued requests therefore has tags far ahead of ``V``, and another tenant's single request (tag ``V``) goes next.
Tags within a lane only grow, so one heap item per lane (its head) is enough: O(log tenants) per request.

Entries are removed lazily: a cancelled or expired entry stays in its lane with ``state is not QUEUED`` and is skipped.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from llmq_batcher.entries import QUEUED, Entry


class _Lane:
    __slots__ = ("entries", "finish", "heap_seq")

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque()
        self.finish = 0.0
        self.heap_seq: int | None = None  # seq of this lane's one valid heap item; None: not in the heap

    def live_head(self) -> Entry | None:
        entries = self.entries
        while entries and entries[0].state is not QUEUED:
            entries.popleft()
        return entries[0] if entries else None


class FairQueue:
    """Queued requests of one model and class. ``depth`` and ``size_bytes`` count live (QUEUED) entries; callers keep
    them in step via :meth:`discard` when they cancel or expire an entry."""

    __slots__ = ("lanes", "heap", "vtime", "arrivals", "depth", "size_bytes")

    def __init__(self) -> None:
        self.lanes: dict[str, _Lane] = {}
        self.heap: list[tuple[float, int, str]] = []  # (start tag, seq, tenant)
        self.vtime = 0.0
        self.arrivals: deque[Entry] = deque()  # arrival order, for the oldest queued age
        self.depth = 0
        self.size_bytes = 0

    def push(self, entry: Entry, weight: float) -> None:
        """Append ``entry`` to its tenant's lane with a fresh SFQ tag (``weight`` > 0)."""
        lane = self.lanes.get(entry.tenant) or self._lane(entry.tenant)
        start = self.vtime if self.vtime > lane.finish else lane.finish
        entry.tag = start
        lane.finish = start + entry.cost / weight
        lane.entries.append(entry)
        self.arrivals.append(entry)
        self.depth += 1
        self.size_bytes += entry.size_bytes
        if lane.heap_seq is None:
            self._activate(entry.tenant, lane)

    def push_front(self, entry: Entry) -> None:
        """Put a re-queued entry at the head of its lane (it has waited already): tag no later than the old head."""
        lane = self._lane(entry.tenant)
        head = lane.live_head()
        entry.tag = min(self.vtime, head.tag) if head else self.vtime
        lane.entries.appendleft(entry)
        self.arrivals.appendleft(entry)
        self.depth += 1
        self.size_bytes += entry.size_bytes
        lane.heap_seq = entry.seq
        heapq.heappush(self.heap, (entry.tag, entry.seq, entry.tenant))

    def discard(self, entry: Entry) -> None:
        """Account for ``entry`` leaving the QUEUED state outside :meth:`take` (cancel, expiry)."""
        self.depth -= 1
        self.size_bytes -= entry.size_bytes

    def peek(self, is_capped: Callable[[str], bool], park: Callable[[str, FairQueue], None]) -> Entry | None:
        """The live entry with the lowest start tag among tenants not capped, or None; it stays queued until
        :meth:`take`. A capped tenant's lane leaves the heap and ``park(tenant, self)`` is called; :meth:`activate`
        brings it back."""
        heap = self.heap
        while heap:
            _, seq, tenant = heap[0]
            lane = self.lanes.get(tenant)
            if lane is None or lane.heap_seq != seq:
                heapq.heappop(heap)  # superseded item
                continue
            head = lane.live_head()
            if head is None:
                heapq.heappop(heap)
                self._retire(tenant, lane)
                continue
            if head.seq != seq:  # the old head was cancelled: re-key the lane
                lane.heap_seq = head.seq
                heapq.heapreplace(heap, (head.tag, head.seq, tenant))
                continue
            if is_capped(tenant):
                heapq.heappop(heap)
                lane.heap_seq = None
                park(tenant, self)
                continue
            return head
        return None

    def take(self, head: Entry) -> None:
        """Dequeue ``head``, the entry :meth:`peek` just returned (no other call in between)."""
        lane = self.lanes[head.tenant]
        lane.entries.popleft()
        if head.tag > self.vtime:
            self.vtime = head.tag
        nxt = lane.live_head()
        if nxt is None:
            heapq.heappop(self.heap)
            lane.heap_seq = None
            self._retire(head.tenant, lane)
        else:
            lane.heap_seq = nxt.seq
            heapq.heapreplace(self.heap, (nxt.tag, nxt.seq, head.tenant))
        self.depth -= 1
        self.size_bytes -= head.size_bytes

    def activate(self, tenant: str) -> None:
        """Put a parked tenant's lane back in the heap (its in-flight count dropped below the cap)."""
        lane = self.lanes.get(tenant)
        if lane is not None and lane.heap_seq is None:
            self._activate(tenant, lane)

    def oldest_enqueued_ms(self) -> int | None:
        """Enqueue time of the oldest live entry (approximate after re-queues), or None when empty."""
        arrivals = self.arrivals
        while arrivals and arrivals[0].state is not QUEUED:
            arrivals.popleft()
        return arrivals[0].enqueued_ms if arrivals else None

    def _activate(self, tenant: str, lane: _Lane) -> None:
        head = lane.live_head()
        if head is not None:
            lane.heap_seq = head.seq
            heapq.heappush(self.heap, (head.tag, head.seq, tenant))

    def _lane(self, tenant: str) -> _Lane:
        lane = self.lanes.get(tenant)
        if lane is None:
            lane = self.lanes[tenant] = _Lane()
        return lane

    def _retire(self, tenant: str, lane: _Lane) -> None:
        # An empty lane whose finish tag V has passed carries no state worth keeping: drop it to bound memory.
        lane.heap_seq = None
        if not lane.entries and lane.finish <= self.vtime:
            del self.lanes[tenant]

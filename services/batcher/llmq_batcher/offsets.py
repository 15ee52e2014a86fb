"""Which Kafka offsets the batcher may commit: only those below its oldest request not yet dispatched or answered.

Pure bookkeeping, keyed by any hashable partition id (aiokafka's TopicPartition in the loop). Offsets of one partition
are tracked in the order they were consumed; :meth:`OffsetTracker.committable` is amortised O(1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable


class _Partition:
    __slots__ = ("pending", "done", "next_offset", "committed")

    def __init__(self) -> None:
        self.pending: deque[int] = deque()  # consumed offsets in order, the settled ones removed from the front
        self.done: set[int] = set()  # settled offsets still behind an unsettled one
        self.next_offset = -1  # one past the highest consumed offset
        self.committed = -1  # the last commit position confirmed by mark_committed (or where consuming began)


class OffsetTracker:
    """Tracks consumed records until settled; the commit position of a partition is its first unsettled offset."""

    def __init__(self) -> None:
        self._partitions: dict[Hashable, _Partition] = {}

    def track(self, partition: Hashable, offset: int) -> None:
        """A record at ``offset`` was consumed and is not settled yet. Offsets must grow within a partition."""
        state = self._partitions.get(partition)
        if state is None:
            state = self._partitions[partition] = _Partition()
            state.committed = offset  # consumption started here: nothing before it needs committing by us
        state.pending.append(offset)
        state.next_offset = offset + 1

    def untrack(self, partition: Hashable, offset: int) -> None:
        """Forget the records consumed from ``offset`` on: the consumer was sought back to consume them again."""
        state = self._partitions.get(partition)
        if state is None:
            return
        while state.pending and state.pending[-1] >= offset:
            state.done.discard(state.pending.pop())
        state.next_offset = min(state.next_offset, offset)

    def settle(self, partition: Hashable, offset: int) -> None:
        """The record at ``offset`` is dispatched, answered or skipped. Unknown partitions are ignored (revoked)."""
        state = self._partitions.get(partition)
        if state is None:
            return
        state.done.add(offset)
        pending = state.pending
        while pending and pending[0] in state.done:
            state.done.discard(pending.popleft())

    def committable(self, partition: Hashable) -> int | None:
        """The offset to commit for ``partition`` (Kafka's "next record to read"), or None when nothing was consumed."""
        state = self._partitions.get(partition)
        if state is None or state.next_offset < 0:
            return None
        return state.pending[0] if state.pending else state.next_offset

    def commit_positions(self) -> dict[Hashable, int]:
        """Commit positions that moved since the last :meth:`mark_committed`: {partition: offset}."""
        changes = {}
        for partition, state in self._partitions.items():
            offset = self.committable(partition)
            if offset is not None and offset != state.committed:
                changes[partition] = offset
        return changes

    def mark_committed(self, positions: dict[Hashable, int]) -> None:
        """Kafka accepted these commit positions."""
        for partition, offset in positions.items():
            state = self._partitions.get(partition)
            if state is not None:
                state.committed = offset

    def forget(self, partition: Hashable) -> None:
        """Drop a partition (revoked in a rebalance): its records will be redelivered to its new owner."""
        self._partitions.pop(partition, None)

    def unsettled(self) -> int:
        """How many consumed records are not settled yet, over all partitions."""
        return sum(len(s.pending) - len(s.done) for s in self._partitions.values())


class HeldRecords:
    """request id -> its records not settled yet (a redelivered copy adds one): settling a request settles them all in
    ``offsets`` (once it is dispatched or answered)."""

    def __init__(self, offsets: OffsetTracker) -> None:
        self.offsets = offsets
        self._records: dict[str, list[tuple[Hashable, int]]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._records

    def hold(self, request_id: str, partition: Hashable, offset: int) -> None:
        self._records.setdefault(request_id, []).append((partition, offset))

    def settle(self, request_id: str) -> None:
        for partition, offset in self._records.pop(request_id, ()):
            self.offsets.settle(partition, offset)

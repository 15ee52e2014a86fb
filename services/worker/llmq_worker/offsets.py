"""Which offset of the worker's partition may be committed: only past batches whose requests are all final."""

from __future__ import annotations

import collections


class OffsetTracker:
    """Counts unfinished requests per taken batch (by Kafka offset, taken in order)."""

    def __init__(self) -> None:
        self._open: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._next_offset: int | None = None
        self._committed: int | None = None

    def add(self, offset: int, requests: int) -> None:
        """A batch at ``offset`` with ``requests`` requests still to finish (0 is allowed: nothing to wait for)."""
        if self._committed is None:
            self._committed = offset  # where consumption resumed: nothing before it to commit
        self._open[offset] = requests
        self._next_offset = offset + 1

    def release(self, offset: int) -> None:
        """One request of the batch at ``offset`` is final and delivered."""
        self._open[offset] -= 1

    def commit_offset(self) -> int | None:
        """The offset to commit now (the next one to read after every fully final batch), or None if unchanged."""
        while self._open and next(iter(self._open.values())) <= 0:
            self._open.popitem(last=False)
        target = next(iter(self._open), self._next_offset)
        if target is None or target == self._committed:
            return None
        self._committed = target
        return target

"""Poison isolation: requests that failed together in one engine failure are bisected until the culprit fails alone."""

from __future__ import annotations

import collections


class Isolator:
    """Plans isolated re-runs. Pure: the worker core submits groups when the engine is idle and reports failures.

    A group that fails is split in halves, each re-run alone; a request that fails while running alone is the culprit.
    """

    def __init__(self) -> None:
        self._groups: collections.deque[list[str]] = collections.deque()
        self._current: list[str] | None = None
        self._failed: list[str] = []
        self._new: list[str] = []

    @property
    def active(self) -> bool:
        """True while suspects wait or run: new work must wait so each group runs alone."""
        return bool(self._groups or self._current is not None or self._new)

    def failed(self, request_id: str) -> None:
        """``request_id`` ended in a shared engine failure."""
        if self._current is not None and request_id in self._current:
            self._failed.append(request_id)
        else:
            self._new.append(request_id)

    def forget(self, request_id: str) -> None:
        """``request_id`` ended otherwise (e.g. canceled while waiting): drop it from every plan."""
        for plan in (*self._groups, self._new, self._failed):
            if request_id in plan:
                plan.remove(request_id)
        self._groups = collections.deque(g for g in self._groups if g)

    def next_step(self) -> tuple[list[str], list[str]]:
        """Call when the engine is idle. Returns (culprits to answer ``errored``, the group to run alone next, maybe [])."""
        culprits: list[str] = []
        if self._current is not None:
            if len(self._current) == 1 and self._failed:
                culprits = list(self._failed)
            else:
                self._push_halves(self._failed)
            self._current, self._failed = None, []
        if self._new:
            self._push_halves(self._new)
            self._new = []
        if self._groups:
            self._current = self._groups.popleft()
        return culprits, list(self._current or [])

    def _push_halves(self, request_ids: list[str]) -> None:
        if not request_ids:
            return
        middle = (len(request_ids) + 1) // 2
        halves = [request_ids[:middle], request_ids[middle:]]
        self._groups.extendleft(reversed([h for h in halves if h]))

"""Injected clocks: policy code never reads the wall clock itself, so tests drive time by hand."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

Sleep = Callable[[float], Awaitable[None]]  # asyncio.sleep, or a test's own (waits are injected like clocks)


class Clock(Protocol):
    def now_ms(self) -> int:
        """Current time as epoch milliseconds."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when told: ``advance(ms)`` or ``set(ms)``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms

    def set(self, ms: int) -> None:
        self._now_ms = ms


SYSTEM_CLOCK = SystemClock()

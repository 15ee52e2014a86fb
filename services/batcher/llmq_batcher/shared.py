"""What the batcher's parts (intake, dispatch, signals, report, the loop) share. They all run on one asyncio thread,
so none of them needs a lock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq_batcher.capacity import SharedCapacity
from llmq_batcher.offsets import HeldRecords, OffsetTracker
from llmq_batcher.policy import BatchPolicy
from llmq_batcher.spans import RequestSpans
from llmq_core import kafka
from llmq_core.clock import Clock
from llmq_core.metrics import BatcherMetrics
from llmq_core.names import Names


@dataclass
class Shared:
    """One policy, one clock and the clients; the consumed offsets and the records each held request came from;
    ``wake``: set when there is news for the decider; ``stopping``: set once by ``BatcherLoop.stop``."""

    policy: BatchPolicy
    producer: kafka.RenewableProducer  # a refused record must not break every later send
    redis: Redis
    clock: Clock
    names: Names
    metrics: BatcherMetrics | None
    capacity: SharedCapacity | None = None  # the fleet's capacity ledgers (None: this batcher's own view only)
    offsets: OffsetTracker = field(default_factory=OffsetTracker)
    spans: RequestSpans = field(default_factory=RequestSpans)  # used only while tracing is on
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    held: HeldRecords = field(init=False)

    def __post_init__(self) -> None:
        self.held = HeldRecords(self.offsets)

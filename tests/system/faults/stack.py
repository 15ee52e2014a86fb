"""A private llmq stack for fault tests: :class:`~llmq_cli.devstack.DevStack` plus per-process faults.

Every process (Kafka and Redis included) belongs to this stack alone, so a test may kill, stop or restart any of them.
Process names are DevStack's: ``kafka``, ``redis``, ``api-0``, ``batcher``, ``worker-sim-0``, ``result-router``...
(with ``batchers`` / ``routers`` above 1 the others are ``batcher-1``..., ``result-router-1``...).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from llmq_cli.devstack import DevStack, StackConfig
from llmq_core import constants, wire
from llmq_core.kafka import topic_layout
from llmq_core.settings import Settings

LLMQ_KINDS = ("api", "batcher", "worker", "result-router")


class FaultStack:
    """Start, hurt and heal one private stack."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.dev = DevStack(cfg)

    @property
    def api_ports(self) -> tuple[int, ...]:
        return self.cfg.api_ports

    def redis(self) -> Redis:
        return Redis.from_url(self.cfg.redis_url, socket_timeout=2, socket_connect_timeout=2)

    async def heal(self, timeout_s: float = 120.0) -> None:
        """Start every process of the stack that is not running and wait until all are healthy (RuntimeError if not)."""
        await asyncio.to_thread(self.dev.up, timeout_s, lambda *_: None)

    async def scale(self, **counts: int) -> list[str]:
        """Grow the stack to ``counts`` (StackConfig fields: ``batchers=4``...): start the processes that adds, the
        running ones untouched, and wait until all are healthy. Returns the names started."""
        before = set(self.rows())
        self.cfg = dataclasses.replace(self.cfg, **counts)
        self.dev = DevStack(self.cfg)
        await self.heal()
        return sorted(set(self.rows()) - before)

    def rows(self) -> dict[str, dict]:
        """``llmq dev status`` rows by process name."""
        return {row["name"]: row for row in self.dev.status()}

    def names(self, *kinds: str) -> list[str]:
        """Process names of the given kinds (all llmq services when none given), in start order."""
        kinds = kinds or LLMQ_KINDS
        return [name for name, row in self.rows().items() if row["kind"] in kinds]

    def pid(self, name: str) -> int:
        return json.loads((self.dev.pids / f"{name}.json").read_text())["pid"]

    def pids(self) -> dict[str, int]:
        """{name: pid} of every llmq service process."""
        return {name: self.pid(name) for name in self.names()}

    def alive(self, name: str) -> bool:
        return _running(self.pid(name))

    def send(self, name: str, sig: signal.Signals) -> float:
        """Send ``sig`` to the process ``name``; returns time.monotonic() at sending."""
        os.kill(self.pid(name), sig)
        return time.monotonic()

    async def kill_and_heal(self, name: str, down_s: float) -> tuple[float, float]:
        """SIGKILL ``name``, leave it down ``down_s``, start it again: time.monotonic() at the kill and once the stack
        is healthy again."""
        killed_s = self.send(name, signal.SIGKILL)
        await asyncio.sleep(down_s)
        await self.heal()
        return killed_s, time.monotonic()

    async def wait_exit(self, name: str, timeout_s: float) -> float:
        """Seconds until ``name`` exited (raises TimeoutError after ``timeout_s``)."""
        pid, start = self.pid(name), time.monotonic()
        async with asyncio.timeout(timeout_s):
            while _running(pid):
                await asyncio.sleep(0.05)
        return time.monotonic() - start

    def rss_kb(self, name: str) -> int:
        """Resident set size of ``name`` in KiB (VmRSS)."""
        for line in Path(f"/proc/{self.pid(name)}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"{name} has no VmRSS")

    async def worker_heartbeat(self, worker_id: str) -> wire.WorkerHeartbeat | None:
        """The worker's latest heartbeat from its liveness key, if any (``worker_id`` as DevStack names it, e.g.
        ``sim-0``; the worker qualifies it by its region)."""
        redis = self.redis()
        try:
            data = await redis.get(constants.alive_key("worker", self.cfg.instance_id(worker_id)))
        finally:
            await redis.aclose()
        return wire.decode(data) if data else None

    def down(self) -> None:
        self.dev.down()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Tap:
    """Reads llmq ``topics`` (partition counts of the default settings) from their current end on and keeps every record: (arrival monotonic s, decoded message).

    Undecodable records are kept as their raw bytes. Use :meth:`start` before the traffic of interest begins.
    """

    def __init__(self, bootstrap: str, *topics: str) -> None:
        self.topics = topics
        self.records: list[tuple[float, object, list]] = []
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._consumer.start()
        layout = topic_layout(Settings())
        partitions = [TopicPartition(topic, p) for topic in self.topics for p in range(layout[topic])]
        self._consumer.assign(partitions)
        await self._consumer.seek_to_end(*partitions)
        for tp in partitions:
            await self._consumer.position(tp)  # resolve "end" now, before the traffic starts
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for record in self._consumer:
            try:
                message = wire.decode(record.value, wire.content_type_of(record.headers))
            except (msgspec.DecodeError, msgspec.ValidationError):
                message = record.value
            self.records.append((time.monotonic(), message, list(record.headers or ())))

    def messages(self, kind: type) -> list:
        return [m for _, m, _ in self.records if isinstance(m, kind)]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()

"""Reads the batchers' saturation reports (Redis hash ``llmq:saturation``) for admission control."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import msgspec
from redis.asyncio import Redis

from llmq_core import constants, wire
from llmq_core.clock import Clock
from llmq_api.admission import Admitted, Saturation, merge_reports

log = logging.getLogger(__name__)

POLL_MS = 500
READ_TIMEOUT_S = 1.0
FORGET_AFTER_MS = 600_000  # reports this old come from batchers that are gone: delete them


class SaturationMonitor:
    """Polls the reports every ``poll_ms``; :attr:`current` merges those fresher than ``stale_ms``.

    When Redis or the batchers go quiet the reports age out and admission falls back to the pod's own in-flight cap.
    :attr:`admitted` counts this pod's admissions until the reports include them.
    """

    def __init__(self, redis: Redis, clock: Clock, stale_ms: int, *, key: str = constants.REDIS_SATURATION_KEY,
                 poll_ms: int = POLL_MS, heard_ms: Callable[[], Mapping[str, int]] = dict) -> None:
        """``heard_ms``: model -> the last worker heartbeat this pod heard itself (epoch ms)."""
        self._redis = redis
        self._heard_ms = heard_ms
        self._clock = clock
        self._stale_ms = stale_ms
        self._key = key
        self._poll_s = poll_ms / 1000
        self.reports: list[wire.BatcherSaturation] = []
        self.admitted = Admitted()

    @property
    def current(self) -> Saturation:
        return merge_reports(self.reports, self._clock.now_ms(), self._stale_ms, self._heard_ms(), self.admitted)

    def admit(self, model: str, priority_class: str, count: int = 1) -> None:
        """Count an admission now (``count=-1`` takes it back)."""
        self.admitted.add(model, priority_class, self._clock.now_ms(), count)

    async def run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.refresh(), READ_TIMEOUT_S)
            except Exception as exc:
                log.warning("reading batcher saturation failed: %r", exc)
            await asyncio.sleep(self._poll_s)

    async def refresh(self) -> None:
        """Read every report once; delete the ones left by batchers that stopped long ago."""
        fields = await self._redis.hgetall(self._key)
        reports, gone = [], []
        now_ms = self._clock.now_ms()
        for field, data in fields.items():
            try:
                report = wire.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                report = None
            if not isinstance(report, wire.BatcherSaturation) or now_ms - report.sent_ms > FORGET_AFTER_MS:
                gone.append(field)
            else:
                reports.append(report)
        self.reports = reports
        if gone:
            await self._redis.hdel(self._key, *gone)

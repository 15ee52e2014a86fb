"""Admission control's Redis edge: reads the batchers' saturation reports (hash ``llmq:saturation``), and shares
this pod's admitted, unfinished requests with the other pods (hash ``llmq:unfinished``).

Each batcher rewrites its report every ``SATURATION_REPORT_INTERVAL_MS``; a report that missed
``admission.STALE_REPORT_INTERVALS`` rewrites (``api_saturation_stale_ms``) is stale and left out of :attr:`current`;
one not rewritten for ``FORGET_AFTER_MS`` is deleted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import msgspec
from redis.asyncio import Redis

from llmq_api.admission import Admitted, Saturation, Unfinished, all_unfinished, merge_reports
from llmq_core import constants, wire
from llmq_core.clock import Clock

log = logging.getLogger(__name__)

POLL_MS = 100  # also how often this pod's unfinished requests reach the other pods: a burst's lag between pods
READ_TIMEOUT_S = 1.0
FORGET_AFTER_MS = 600_000  # reports this old come from batchers that are gone: delete them


class SaturationMonitor:
    """Every ``poll_ms``: publishes this pod's unfinished requests and reads the reports of the batchers and of the
    other pods; :attr:`current` merges those not stale (``stale_ms``: Settings.api.saturation_stale_ms, by default
    ``admission.STALE_REPORT_INTERVALS`` report intervals; see :func:`llmq_api.admission.is_stale`).

    When Redis or the batchers go quiet the reports age out and admission falls back to the pod's own in-flight cap
    (what a pod then does: ``llmq_api.admission``'s docstring, Staleness).
    :attr:`admitted` counts this pod's admissions until the reports include them, :attr:`unfinished` until they end.
    """

    def __init__(
        self,
        redis: Redis,
        clock: Clock,
        stale_ms: int,
        *,
        key: str = constants.REDIS_SATURATION_KEY,
        poll_ms: int = POLL_MS,
        heard_ms: Callable[[], Mapping[str, int]] = dict,
        instance_id: str = "",
        unfinished_key: str = constants.REDIS_UNFINISHED_KEY,
    ) -> None:
        """``heard_ms``: model -> the last worker heartbeat this pod heard itself (epoch ms)."""
        self._redis = redis
        self._heard_ms = heard_ms
        self._clock = clock
        self._stale_ms = stale_ms
        self._key = key
        self._unfinished_key = unfinished_key
        self._instance_id = instance_id
        self._poll_s = poll_ms / 1000
        self.reports: list[wire.BatcherSaturation] = []
        self.others: list[wire.PodUnfinished] = []
        self.admitted = Admitted()
        self.unfinished = Unfinished()

    @property
    def current(self) -> Saturation:
        now_ms = self._clock.now_ms()
        unfinished = all_unfinished(self.unfinished.counts, self.others, now_ms, self._stale_ms)
        return merge_reports(self.reports, now_ms, self._stale_ms, self._heard_ms(), self.admitted, unfinished)

    def admit(self, model: str, priority_class: str) -> Callable[[bool], None]:
        """Count an admission now; returns what ends it: ``end(refused)``, where ``refused`` takes the admission back
        (a later check refused it: it never queued)."""
        self.admitted.add(model, priority_class, self._clock.now_ms())
        end_unfinished = self.unfinished.start(model, priority_class)

        def end(refused: bool = False) -> None:
            if refused:
                self.admitted.add(model, priority_class, self._clock.now_ms(), -1)
            end_unfinished()

        return end

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):  # not wait_for: 3.11's can swallow this loop's cancel
                    await self.refresh()
            except Exception as exc:
                log.warning("reading batcher saturation failed: %r", exc)
            await asyncio.sleep(self._poll_s)

    async def refresh(self) -> None:
        """Publish this pod's unfinished requests, then read every report once (the other pods' too): one round trip
        (at 10 a second per pod, three commands each were about half of a pod's Redis writes under load). Not a
        transaction, and need not be: the report is rewritten whole every poll and the reads change nothing, so a crash
        between them leaves at most the last report, which ages out as before."""
        async with self._redis.pipeline(transaction=False) as pipe:
            if self._instance_id:
                own = self.unfinished.report(self._instance_id, self._clock.now_ms())
                pipe.hset(self._unfinished_key, self._instance_id, wire.encode(own))
            pipe.hgetall(self._key)
            pipe.hgetall(self._unfinished_key)
            *_, batchers, pods = await pipe.execute()
        self.reports = await self._read(self._key, batchers, wire.BatcherSaturation)
        others = await self._read(self._unfinished_key, pods, wire.PodUnfinished)
        self.others = [report for report in others if report.instance_id != self._instance_id]

    async def _read(self, key: str, fields: dict, kind: type) -> list:
        """The reports of ``kind`` among hash ``key``'s ``fields``; deletes garbage and those sent long ago (by
        processes gone)."""
        reports, gone = [], []
        now_ms = self._clock.now_ms()
        for field, data in fields.items():
            try:
                report = wire.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                report = None
            if not isinstance(report, kind) or now_ms - report.sent_ms > FORGET_AFTER_MS:
                gone.append(field)
            else:
                reports.append(report)
        if gone:
            await self._redis.hdel(key, *gone)
        return reports

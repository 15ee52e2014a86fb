"""The batcher's saturation report (what API pods admit by: ``llmq_batcher.saturation``) and its stats counters,
written to Redis together in one round trip.

Written after a round once ``SATURATION_REPORT_INTERVAL_MS`` has passed since the last write (and at drain), and by
its own task whenever no round wrote for an interval (a round blocked on a broker outage, or none at all): the report
is rewritten at least every interval while the batcher runs, and API pods treat one several intervals old as stale
(``llmq_api.admission``). A failed write is logged and counted (``llmq_batcher_saturation_report_failures_total``);
the next interval writes a fresh report again. The counts of a failed write are lost (stats are counters for people;
the report is rewritten whole each time).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping

from llmq_batcher.policy import CLASS_KEYS, BatchDispatch, Decision
from llmq_batcher.saturation import BacklogDrain, DrainMeter, saturation_report
from llmq_batcher.shared import Shared
from llmq_core import constants, wire
from llmq_core.models import BUILTIN_MODELS
from llmq_core.status import outcome_label

log = logging.getLogger(__name__)


class ReportWriter:
    """Counts what the rounds sent and writes the report every ``interval_ms`` (epoch ms by ``shared.clock``).
    ``catalogue``: the models the report always carries (others only while they have workers). ``sleep``: how
    :meth:`run` waits (seconds), injected for tests."""

    def __init__(
        self,
        shared: Shared,
        catalogue: Collection[str] = frozenset(BUILTIN_MODELS),
        interval_ms: int = constants.SATURATION_REPORT_INTERVAL_MS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.shared = shared
        self.catalogue = catalogue
        self.interval_ms = interval_ms
        self._sleep = sleep
        self.started_ms = shared.clock.now_ms()
        self.drain = DrainMeter(self.started_ms)
        self.backlog_drain = BacklogDrain(self.started_ms)
        self._counts: Counter[str] = Counter()  # stats counted since they were last written
        self._last_ms = 0  # when the last write began

    def count(self, sent: list[BatchDispatch], decision: Decision) -> None:
        """Count a round's batches that went out and its answers."""
        counts = self._counts
        for batch in sent:
            counts["batches"] += 1
            counts["requests"] += len(batch.requests)
            counts[f"batches:{batch.model}"] += 1
            counts[f"requests:{batch.model}"] += len(batch.requests)
            counts[f"flush_{batch.flush_reason}"] += 1
        self.drain.dispatched(sent)
        self.backlog_drain.dispatched(sent)
        for answer in decision.answers:
            counts[outcome_label(answer.outcome, answer.error_type)] += 1

    def due_in_ms(self, now_ms: int) -> int:
        """How long until the next write is due (<= 0: due now)."""
        return self._last_ms + self.interval_ms - now_ms

    async def after_round(self, decision: Decision, force: bool = False) -> None:
        """A round's hook: write with the round's queue load when due (always when ``force``)."""
        if force or self.due_in_ms(self.shared.clock.now_ms()) <= 0:
            await self.write(decision.load)

    async def run(self) -> None:
        """Until stopping: write whenever no round did for an interval."""
        shared = self.shared
        while not shared.stopping.is_set():
            await self._sleep(max(self.due_in_ms(shared.clock.now_ms()), 0) / 1000)
            now_ms = shared.clock.now_ms()
            if self.due_in_ms(now_ms) <= 0:
                await self.write(shared.policy.load(now_ms))

    async def write(self, load: Mapping[str, wire.QueueLoad]) -> bool:
        """Write the counts since the last write, ``load`` (all models' queues per class) and the report, in one
        pipeline; False when it failed (logged and counted)."""
        shared, now_ms = self.shared, self.shared.clock.now_ms()
        self._last_ms = now_ms
        counts, self._counts = self._counts, Counter()
        stats = {}
        for key in CLASS_KEYS:
            stats[f"queued_{key}"] = load[key].depth
            stats[f"oldest_ms_{key}"] = load[key].oldest_age_ms
        models = shared.policy.model_states(now_ms)
        if shared.metrics is not None:
            shared.metrics.queues(
                (key, name, c.depth, c.oldest_age_ms)
                for name, state in models.items()
                for key, c in state.classes.items()
            )
            shared.metrics.prefix_index(shared.policy.prefixes.blocks(), shared.policy.prefixes.ignored)
        report = saturation_report(
            shared.policy.config.batch_id_prefix,
            self.started_ms,
            now_ms,
            load,
            models,
            self.catalogue,
            self.drain.rates(now_ms),
            self.backlog_drain.rates(now_ms, models),
        )
        try:
            async with shared.redis.pipeline(transaction=False) as pipe:
                for name, value in counts.items():
                    pipe.hincrby(shared.names.stats_key, name, value)
                pipe.hset(shared.names.stats_key, mapping=stats)
                pipe.hset(shared.names.saturation_key, report.batcher_id, wire.encode(report))
                await pipe.execute()
        except Exception as exc:
            if shared.metrics is not None:
                shared.metrics.saturation_report_failures.inc()
            log.warning("writing the saturation report failed, again in %d ms: %r", self.interval_ms, exc)
            return False
        return True

"""The batcher loop: consume requests and signals -> policy.schedule -> produce batches and answers -> commit.

Its parts: :class:`~llmq_batcher.intake.Intake` (the request consumer, GROUP_BATCHER with manual commits, and each
record's entry, :mod:`llmq_batcher.entry_plan`), :class:`~llmq_batcher.signals.Signals` (heartbeats, cancels, the pod
watch, the llmq.results tail), :class:`~llmq_batcher.dispatch.Dispatcher` (batches and answers out) and
:class:`~llmq_batcher.report.ReportWriter` (the saturation report and stats). The loop runs them, and the decider,
which runs the policy on every event and at its wake-up time, then commits what is settled. All of them share one
asyncio thread, so the policy needs no locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from redis.asyncio import Redis

from llmq_batcher.capacity import SharedCapacity
from llmq_batcher.dispatch import Dispatcher
from llmq_batcher.intake import EntryRules, Intake, TopicLister
from llmq_batcher.policy import BatchPolicy, Decision
from llmq_batcher.report import ReportWriter
from llmq_batcher.shared import Shared
from llmq_batcher.signals import PodChecks, Signals, supervised
from llmq_core import constants, kafka, runtime
from llmq_core.clock import Clock
from llmq_core.metrics import BatcherMetrics
from llmq_core.models import BUILTIN_MODELS
from llmq_core.names import Names

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0


class BatcherLoop:
    """Owns the policy and the offsets; ``run()`` returns after ``stop()`` once held work is dispatched or uncommitted."""

    def __init__(
        self,
        policy: BatchPolicy,
        consumer: AIOKafkaConsumer,
        producer: kafka.RenewableProducer,
        redis: Redis,
        clock: Clock,
        *,
        max_queued: int,
        names: Names = Names(),
        metrics: BatcherMetrics | None = None,
        results: AIOKafkaConsumer | None = None,
        entry: EntryRules = EntryRules(),
        pods: PodChecks = PodChecks(),
        catalogue: Collection[str] = frozenset(BUILTIN_MODELS),
        capacity: SharedCapacity | None = None,
        list_topics: TopicLister | None = None,
    ) -> None:
        """``producer``: a kafka.RenewableProducer in service (one refused record must not break every later send).
        ``max_queued``: Settings.batcher.max_queued (deferred partitions pause at half of it). ``results``: a consumer
        of llmq.results for the tail (None: none); ``entry``: what records entering are checked against; ``pods``:
        how gone API pods are told; ``catalogue``: the models the saturation report always carries; ``capacity``: the
        fleet's capacity ledgers each batch is claimed from (None: none); ``list_topics``: lists the cluster's
        topics, for the entry check of Kafka-direct reply topics (None: none)."""
        self.shared = shared = Shared(policy, producer, redis, clock, names, metrics, capacity)
        self.policy, self.consumer, self.producer, self.clock = policy, consumer, producer, clock
        self.offsets, self.names, self.metrics = shared.offsets, names, metrics
        self.max_queued = max_queued
        self.signals = Signals(shared, results, pods)
        self.intake = Intake(shared, consumer, entry, self.signals.announced, list_topics)
        self.dispatcher = Dispatcher(shared)
        self.report = ReportWriter(shared, catalogue)
        self._last_commit_ms = 0
        self._deferred_blocked = False  # whether the last round paused the deferred partitions

    def topics(self) -> list[str]:
        """What it consumes: the request and ingress topics."""
        return self.intake.topics()

    def subscribe(self) -> None:
        """Join GROUP_BATCHER over :meth:`topics`; revoked partitions are committed and forgotten."""
        self.consumer.subscribe(self.topics(), listener=_Revocations(self))

    def stop(self) -> None:
        self.shared.stopping.set()
        self.shared.wake.set()

    async def ingest(self, tp: TopicPartition, record) -> None:
        """Take one consumed record in (:meth:`Intake.ingest`)."""
        await self.intake.ingest(tp, record)

    async def run(self) -> None:
        inputs = [self.intake.consume, *self.signals.inputs(), self.report.run]
        feeders = [asyncio.create_task(supervised(read, self.shared.stopping)) for read in inputs]
        try:
            await self._decide()
        finally:
            await runtime.cancel_and_wait(feeders)

    async def _decide(self) -> None:
        while True:
            stopping = self.shared.stopping.is_set()
            decision = await self.step(drain=stopping)
            if stopping:
                return
            await self._sleep_until(decision.next_wake_ms)

    async def step(self, drain: bool = False) -> Decision:
        """One round: schedule, produce batches and answers, write the report when due, pause/resume deferred,
        commit (always when ``drain``)."""
        decision = self.policy.schedule(self.clock.now_ms(), drain=drain)
        self.report.count(await self.dispatcher.act(decision), decision)
        await self.report.after_round(decision, force=drain)
        self._pause_deferred()
        await self._commit(force=drain)
        return decision

    async def _sleep_until(self, wake_ms: int | None) -> None:
        timeout_s = IDLE_WAKE_S if wake_ms is None else min(max(wake_ms - self.clock.now_ms(), 0) / 1000, IDLE_WAKE_S)
        if not self.shared.wake.is_set():  # about one round per fetch under load: no task, no timer when woken already
            try:
                async with asyncio.timeout(timeout_s):  # wait_for would wrap the wait in a task every round
                    await self.shared.wake.wait()
            except TimeoutError:
                pass
        self.shared.wake.clear()

    def _pause_deferred(self) -> None:
        """Deferred records stay in Kafka while deferred work queued here fills its buffer or the queue is half full."""
        blocked = self.policy.deferred_paused() or self.policy.queued_total * 2 >= self.max_queued
        if not blocked and not self._deferred_blocked:
            return  # nothing paused since the last resume (a partition assigned since starts unpaused)
        self._deferred_blocked = blocked
        deferred = [tp for tp in self.consumer.assignment() if tp.topic == self.names.deferred_topic]
        paused = self.consumer.paused()
        if blocked:
            todo = [tp for tp in deferred if tp not in paused]
            if todo:
                self.consumer.pause(*todo)
        else:
            todo = [tp for tp in deferred if tp in paused]
            if todo:
                self.consumer.resume(*todo)

    async def _commit(self, force: bool = False) -> None:
        now_ms = self.clock.now_ms()
        if not force and now_ms - self._last_commit_ms < constants.KAFKA_COMMIT_INTERVAL_MS:
            return
        positions = self.offsets.commit_positions()
        if not positions:
            return
        assigned = self.consumer.assignment()
        positions = {tp: offset for tp, offset in positions.items() if tp in assigned}
        try:
            if positions:
                await self.consumer.commit(positions)
                self.offsets.mark_committed(positions)
        except Exception as exc:  # a rebalance in progress: the next round retries
            log.warning("offset commit failed: %s", exc)
        self._last_commit_ms = now_ms

    async def commit_revoked(self, revoked: list[TopicPartition]) -> None:
        """Before losing partitions: commit what is settled on them, then forget them."""
        positions = {tp: self.offsets.committable(tp) for tp in revoked}
        positions = {tp: offset for tp, offset in positions.items() if offset is not None}
        try:
            if positions:
                await self.consumer.commit(positions)
        except Exception as exc:
            log.warning("commit on revocation failed: %s", exc)
        for tp in revoked:
            self.offsets.forget(tp)


class _Revocations(ConsumerRebalanceListener):
    def __init__(self, loop: BatcherLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked) -> None:
        await self.loop.commit_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        pass

"""The worker's I/O loop: consume Batches from its partition -> run them on the engine -> publish results.

Five tasks share one :class:`~llmq_worker.core.WorkerCore`: batch fetching (with backpressure), engine events, heartbeats
(which also expire overdue requests), Cancels, and the progress writes that let another worker continue a request. All
policy is in the core; this module only moves bytes, and what the core answers goes out through a
:class:`~llmq_worker.publisher.ResultPublisher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from llmq_core import runtime, tracing, wire
from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import KAFKA_COMMIT_INTERVAL_MS, alive_key
from llmq_core.kafka import RECORD_REFUSED_ERRORS, dead_letter
from llmq_core.metrics import WorkerMetrics
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_worker import resume
from llmq_worker.core import Outbox, WorkerCore
from llmq_worker.engine import Engine
from llmq_worker.ledger import LedgerWriter
from llmq_worker.prefix_cache import PrefixReporter
from llmq_worker.publisher import ResultPublisher
from llmq_worker.spans import RequestSpans

log = logging.getLogger(__name__)

FETCH_TIMEOUT_MS = 100
RESUBSCRIBE_DELAY_S = 1.0


class WorkerLoop:
    """Runs one worker until ``stop`` is set, then drains (bounded by ``shutdown_grace_s``) and commits."""

    def __init__(
        self,
        *,
        core: WorkerCore,
        engine: Engine,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        redis,
        clock: Clock,
        heartbeat_interval_ms: int,
        shutdown_grace_s: float,
        max_pending: int,
        metrics: WorkerMetrics | None = None,
        names: Names = Names(),
        prefix_reporter: PrefixReporter | None = None,
        progress_interval_ms: int = 500,
        max_continuations: int = 3,
    ) -> None:
        """``consumer`` must be started with no subscription; ``max_pending``: requests taken but not final, at most;
        ``names``: the topics and channels it uses (llmq's own; tests may pick others); ``prefix_reporter``: publishes
        the engine's prefix cache with the heartbeats (None: the engine keeps none); ``progress_interval_ms``: how
        often the tokens generated go to Redis for a continuation (:meth:`WorkerCore.flush_progress`);
        ``max_continuations``: the batchers' limit, which a restarted worker's continuations count against too."""
        self._core = core
        self._engine = engine
        self._consumer = consumer
        self._producer = producer
        self._redis = redis
        self._clock = clock
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._shutdown_grace_s = shutdown_grace_s
        self._max_pending = max_pending
        self._tp = TopicPartition(names.batches_topic, core.partition)
        self._progress = asyncio.Event()  # set whenever requests finish: wakes the fetcher and the drain
        self._commit_lock = asyncio.Lock()
        self._committed = -1
        self._to_commit = -1  # the newest offset past fully delivered batches (committed within the interval)
        self._last_commit_ms = 0
        self._metrics = metrics
        self._names = names
        self._spans = RequestSpans(core.worker_id)  # used only while tracing is on
        self._publisher = ResultPublisher(producer, redis, names, self._spans)
        self._ledger = LedgerWriter(redis, names, core.worker_id)
        self._prefix_reporter = prefix_reporter
        self._progress_interval_ms = progress_interval_ms
        self._max_continuations = max_continuations

    @classmethod
    def build(
        cls,
        engine: Engine,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        redis,
        settings: Settings,
        *,
        worker_id: str,
        partition: int,
        model: str,
        clock: Clock = SYSTEM_CLOCK,
        max_pending: int | None = None,
        metrics: WorkerMetrics | None = None,
        names: Names = Names(),
    ) -> WorkerLoop:
        """A loop over a fresh :class:`WorkerCore` of ``engine``: worker ``worker_id`` serving ``model`` on
        ``partition``, heartbeat and shutdown grace from ``settings``; ``max_pending`` None: four times the engine's
        slots."""
        core = WorkerCore(
            worker_id=worker_id,
            partition=partition,
            model=model,
            engine=engine,
            clock=clock,
            stream_log_max_bytes=settings.worker.stream_log_max_bytes,
        )
        ledger = getattr(engine, "prefix_ledger", None)
        reporter = None
        if ledger is not None:
            reporter = PrefixReporter(
                ledger,
                worker_id=worker_id,
                model=model,
                interval_ms=settings.worker.prefix_summary_interval_ms,
                max_blocks=settings.worker.prefix_summary_max_blocks,
                channel=names.heartbeats_channel,
            )
        return cls(
            core=core,
            engine=engine,
            consumer=consumer,
            producer=producer,
            redis=redis,
            clock=clock,
            heartbeat_interval_ms=settings.worker.heartbeat_interval_ms,
            shutdown_grace_s=settings.runtime.shutdown_grace_s,
            max_pending=4 * engine.capacity().max_slots if max_pending is None else max_pending,
            metrics=metrics,
            names=names,
            prefix_reporter=reporter,
            progress_interval_ms=settings.worker.progress_interval_ms,
            max_continuations=settings.batcher.max_continuations,
        )

    @property
    def core(self) -> WorkerCore:
        return self._core

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or a task fails (re-raised after cleanup)."""
        self._consumer.assign([self._tp])
        await self._heartbeat_once()
        workers = [
            asyncio.create_task(self._events(), name="events"),
            asyncio.create_task(self._cancels(), name="cancels"),
            asyncio.create_task(self._progress_writes(), name="progress"),
        ]
        takers = [
            asyncio.create_task(self._fetch(), name="fetch"),
            asyncio.create_task(self._heartbeats(), name="heartbeats"),
        ]
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*workers, *takers, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopper}:
                task.result()  # a failed task ends the worker
            log.info("draining: %d requests in flight", self._core.pending)
            await _cancel(takers)
            await self._drain()
            await self._commit(force=True)
        finally:
            await _cancel([*workers, *takers, stopper])
            with contextlib.suppress(Exception):
                await self._redis.delete(alive_key("worker", self._core.worker_id))

    async def _drain(self) -> None:
        try:
            async with asyncio.timeout(self._shutdown_grace_s):
                while self._core.pending:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            log.warning("shutdown grace over: handing back %d requests", self._core.pending)
            self._core.abandon_all()

    async def _fetch(self) -> None:
        while True:
            while self._core.pending >= self._max_pending:
                self._progress.clear()
                await self._progress.wait()
            records = await self._consumer.getmany(self._tp, timeout_ms=FETCH_TIMEOUT_MS, max_records=4)
            for record in records.get(self._tp, []):
                await self._deliver(await self._take(record))

    async def _take(self, record) -> Outbox:
        try:
            batch = wire.decode_record(record.value, record.headers)  # raises only these two, for any bad record
            reason = f"not a batch: {type(batch).__name__}"
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            batch, reason = None, str(exc)
        if not isinstance(batch, wire.Batch):
            log.error("dead-lettering record at offset %d: %s", record.offset, reason)
            try:
                await dead_letter(self._producer, record, reason, topic=self._names.dead_letters_topic)
            except RECORD_REFUSED_ERRORS as exc:  # it holds no request; retrying it would stop this partition for good
                log.error("dead-letters refused the record at offset %d (%r): skipping it", record.offset, exc)
            self._core.skip(record.offset)
            return Outbox()
        log.debug("took batch of %d", len(batch.requests), extra={"batch_id": batch.batch_id})
        if self._metrics is not None:
            self._metrics.batch_taken(batch)
        if tracing.enabled():
            self._spans.taken(batch, self._clock.now_ms())
        marks = await resume.stream_marks(self._redis, batch)
        batch = await resume.continued(self._redis, batch, marks, self._max_continuations)
        out = self._core.take_batch(batch, record.offset, marks)
        await asyncio.sleep(0)  # an idle engine starts its window with this batch first: the ledger then says so
        await self._write_ledger(took=batch.batch_id)
        return out

    async def _events(self) -> None:
        while True:
            events = await self._engine.next_events()
            await self._deliver(self._core.on_events(events))

    async def _progress_writes(self) -> None:
        while True:
            await asyncio.sleep(self._progress_interval_ms / 1000)
            await self._deliver(self._core.flush_progress())

    async def _cancels(self) -> None:
        while True:
            try:
                await self._listen_for_cancels()
            except (RedisError, OSError):
                # Cancels sent meanwhile are lost; the deadline sweep still ends overdue requests.
                log.exception("cancel subscription lost: subscribing again")
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)

    async def _listen_for_cancels(self) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._names.cancels_channel)
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                try:
                    cancel = wire.decode(message["data"])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if isinstance(cancel, wire.Cancel):
                    await self._deliver(self._core.cancel(cancel.request_id, cancel.reason))
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_interval_ms / 1000)
            await self._deliver(self._core.expire_overdue())
            try:
                await self._commit()
            except KafkaError as exc:  # the offset stays pending: the next heartbeat or delivery commits it
                log.warning("committing offset %d failed (%r): again at the next heartbeat", self._to_commit, exc)
            await self._heartbeat_once()

    async def _write_ledger(self, took: str | None = None, beat: wire.WorkerHeartbeat | None = None) -> None:
        beat = beat or self._core.heartbeat(self._clock.now_ms(), self._engine.context_window)
        await self._ledger.write(beat, self._engine.capacity().window_end_ms, took)

    async def _heartbeat_once(self) -> None:
        beat = self._core.heartbeat(self._clock.now_ms(), self._engine.context_window)
        await self._write_ledger(beat=beat)
        if self._metrics is not None:
            self._metrics.heartbeat(beat)
        data = wire.encode(beat)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.publish(self._names.heartbeats_channel, data)
                pipe.set(alive_key("worker", self._core.worker_id), data, px=3 * self._heartbeat_interval_ms)
                await pipe.execute()
        except Exception:  # noqa: BLE001 - a missed heartbeat is retried next interval
            log.exception("heartbeat failed")
        if self._prefix_reporter is not None:
            await self._prefix_reporter.publish(self._redis, self._clock.now_ms())

    async def _deliver(self, out: Outbox) -> None:
        """Publish ``out`` (results first, then replies: see publisher.py), then release its offsets and commit."""
        if not out:
            return
        produced = await self._publisher.publish(out)
        if out.results:  # requests ended: a window may have started, slots freed
            await self._write_ledger()
        if self._metrics is not None:
            for result in produced:
                self._metrics.finished(result)
        offset = self._core.release(out.offsets)
        if out.offsets:
            self._progress.set()
        if offset is not None:
            await self._commit(offset)

    async def _commit(self, offset: int | None = None, *, force: bool = False) -> None:
        """Commit up to ``offset`` (None: what is known already): at most every KAFKA_COMMIT_INTERVAL_MS unless
        ``force``; the heartbeat commits what the interval held back, the drain the rest."""
        async with self._commit_lock:
            if offset is not None:
                self._to_commit = max(self._to_commit, offset)
            now_ms = self._clock.now_ms()
            if self._to_commit <= self._committed:
                return
            if force or now_ms - self._last_commit_ms >= KAFKA_COMMIT_INTERVAL_MS:
                await self._consumer.commit({self._tp: self._to_commit})
                self._committed = self._to_commit
                self._last_commit_ms = now_ms


async def _cancel(tasks: list[asyncio.Task]) -> None:
    await runtime.cancel_and_wait(tasks)

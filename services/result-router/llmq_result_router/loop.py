"""The result-router loop: consume llmq.results -> plan -> store in Redis / produce to reply topics / settle batch-job
lines -> commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from llmq_core import kafka, tracing, wire
from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import HEADER_DELIVERY, KAFKA_COMMIT_INTERVAL_MS
from llmq_core.metrics import RouterMetrics
from llmq_core.names import Names
from llmq_core.settings import Settings
from llmq_core.topics import GiveUp, Presence, TopicView
from llmq_result_router import replies
from llmq_result_router.jobs import JobLedger
from llmq_result_router.once import DeliveryClaims, ReplyFinder, Step
from llmq_result_router.replies import LogGate, ReplyRetry
from llmq_result_router.reply_producer import send_reply
from llmq_result_router.routing import Delivery, plan_delivery
from llmq_result_router.store import ResultStore

log = logging.getLogger(__name__)

RETRY_DELAY_S = 1.0

TopicLister = Callable[[], Awaitable[Iterable[str]]]


class ResultRouter:
    """At-least-once over llmq.results; a claim on ``delivered_key`` keeps each Kafka reply to one delivery across
    kills and rebalances (:mod:`once`; per re-produced copy, for the answers to copies: ``copy_delivered_key``),
    the job ledger's compare-and-set each batch-job line to one settlement. A reply that cannot be produced within
    its tries, or whose topic does not exist (see :mod:`replies`), is dead-lettered: one result never holds up the
    others for long. ``list_topics`` lists the cluster's topics (default: :func:`llmq_core.kafka.cluster_topics` of ``producer``).
    ``instance_id``: this router's, whose alive key tells other routers it lives; ``finder``: searches a reply topic
    for a reply a router claimed but never marked (None: such a claim is taken over unsearched)."""

    def __init__(
        self,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        redis: Redis,
        ledger: JobLedger | None = None,
        metrics: RouterMetrics | None = None,
        results: ResultStore | None = None,
        clock: Clock = SYSTEM_CLOCK,
        list_topics: TopicLister | None = None,
        names: Names = Names(),
        instance_id: str = "result-router",
        finder: ReplyFinder | None = None,
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.producer = producer
        self.redis = redis
        self.results = results or ResultStore(
            redis,
            settings.result_store.ttl_s * 1000,
            settings.result_store.tenant_max_bytes,
            settings.result_store.tenant_max_results,
        )
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.retry = ReplyRetry.from_settings(settings)
        self.claims = DeliveryClaims(
            redis,
            clock,
            instance_id,
            lease_ms=DeliveryClaims.lease_for(settings.router.reply_retry_budget_ms),
            ttl_ms=settings.result_store.ttl_s * 1000,
            finder=finder,
            metrics=metrics,
        )
        self.topics = TopicView(
            clock, settings.router.topic_refresh_ms, settings.kafka.security_protocol != "PLAINTEXT"
        )
        self.list_topics = list_topics or (lambda: kafka.cluster_topics(producer))
        self.names = names
        self.log_gate = LogGate(clock)
        self._listing = asyncio.Lock()  # partitions routed side by side share one listing
        self._streaks: dict[int, int] = {}  # partition -> results in a row that ended unsent after retries
        self._received_ms = 0  # when the records being routed were fetched
        self.reply_prefixes = kafka.reply_topic_prefixes(settings)
        self._stopping = asyncio.Event()
        self._uncommitted = False  # records routed since the last commit
        self._last_commit_ms = 0

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            batches = await self.consumer.getmany(timeout_ms=200, max_records=500)
            self._received_ms = self.clock.now_ms()
            try:
                await self._route_partitions(batches)
                self._uncommitted |= bool(batches)
                await self._commit(force=self._stopping.is_set())
            except (RedisError, KafkaError, OSError) as exc:  # a Redis restart or a broker blip: route them again
                log.warning(
                    "routing %d records failed (%r); again in %.0f s",
                    sum(map(len, batches.values())),
                    exc,
                    RETRY_DELAY_S,
                )
                await asyncio.sleep(RETRY_DELAY_S)
                for tp, records in batches.items():
                    self.consumer.seek(tp, records[0].offset)

    async def _commit(self, force: bool) -> None:
        """Commit the positions past every routed record, at most every KAFKA_COMMIT_INTERVAL_MS unless ``force`` (an
        idle poll returns within 200 ms, so what the interval held back is committed soon after)."""
        now_ms = self.clock.now_ms()
        if self._uncommitted and (force or now_ms - self._last_commit_ms >= KAFKA_COMMIT_INTERVAL_MS):
            await self.consumer.commit()
            self._uncommitted = False
            self._last_commit_ms = now_ms

    async def _route_partitions(self, batches) -> None:
        """Each partition's records in order, the partitions side by side: a reply being retried on one partition holds
        up no other. Raises the first failure once every partition is done."""
        done = await asyncio.gather(
            *(self._handle_all(records) for records in batches.values()), return_exceptions=True
        )
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _handle_all(self, records) -> None:
        for record in records:
            await self._handle(record)

    async def _handle(self, record) -> None:
        try:
            message = wire.decode_record(record.value, record.headers)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(record, str(exc))
            return
        if not isinstance(message, wire.FinalResult):
            await self._dead_letter(record, f"not a final_result: {type(message).__name__}")
            return
        try:
            await self._route_traced(message, record)
        except (RedisError, KafkaError, OSError):
            raise  # transient: run() routes the fetch again
        except Exception as exc:  # this record's own fault: run() would route it again forever, stopping its partition
            log.exception("routing the record at %s[%d]@%d failed", record.topic, record.partition, record.offset)
            await self._dead_letter(record, f"{type(exc).__name__}: {exc}")

    async def _route_traced(self, message: wire.FinalResult, record) -> None:
        if not tracing.enabled():
            await self._route(message, record)
            return
        span = tracing.start_span(
            "result_router.route",
            parent=tracing.header_traceparent(record.headers),
            kind=tracing.SpanKind.CONSUMER,
            attributes={"llmq.request_id": message.request_id, "llmq.outcome": message.outcome.value},
        )
        with tracing.use_span(span):
            await self._route(message, record)

    async def _route(self, message: wire.FinalResult, record) -> None:
        if await self._forged(message):
            return
        first = await self._deliver(plan_delivery(message, self.reply_prefixes), record)
        if self.metrics is not None:
            self.metrics.result(message, first)
        if self.ledger is not None and isinstance(message.reply_to, wire.JobReply):
            await self.ledger.on_result(message)

    async def _forged(self, message: wire.FinalResult) -> bool:
        """A batch-job line result that no job of its tenant dispatched is dropped before anything sees it: not stored
        (its request id would answer GET /v1/requests), not settled, counted."""
        if self.ledger is None or not isinstance(message.reply_to, wire.JobReply):
            return False
        reason = await self.ledger.forgery(message)
        if reason is None:
            return False
        log.warning(
            "dropping a forged line result (%s) for batch %s",
            reason,
            message.reply_to.batch_id,
            extra={"request_id": message.request_id},
        )
        if self.metrics is not None:
            self.metrics.forged_results.labels(reason).inc()
        return True

    async def _deliver(self, delivery: Delivery, record) -> bool:
        """Store and reply (or dead-letter ``record`` when no reply can be produced); True when this is the first result
        stored for the request (metrics count it once)."""
        first = await self._store(delivery)
        if delivery.undeliverable is not None:
            self._count_reply_dead_letter("invalid_topic")
            await self._dead_letter(record, delivery.undeliverable, delivery.reply_topic, _unsent(delivery, record))
            return first
        if delivery.reply_topic is None:
            return first
        failed = await self.claims.once(
            delivery.delivered_key,
            delivery.reply_topic,
            delivery.reply_key,
            lambda: self._reply(delivery, record.partition),
        )
        if failed is not None and failed is not Step.SKIP:
            self._count_reply_dead_letter(failed.kind)
            await self._dead_letter(record, failed.reason, delivery.reply_topic, _unsent(delivery, record))
            if failed.topic_wide:  # deleted since the listing: its next results wait for none
                self.topics.forget(delivery.reply_topic)
        return first

    async def _reply(self, delivery: Delivery, partition: int) -> GiveUp | None:
        """Produce the reply to a topic that exists, with a few tries for transient errors within the retry budget;
        why it ended unsent (None: it was sent)."""
        topic = delivery.reply_topic
        if not await self._exists(topic):
            return self.topics.missing(topic)
        started_ms, failures = self.clock.now_ms(), 0
        while True:
            try:
                await self._produce_reply(delivery, self.clock.now_ms() - started_ms)
                self._streaks[partition] = 0
                return None
            except KafkaError as exc:
                failures += 1
                elapsed_ms = self.clock.now_ms() - started_ms
                wait_ms = self.retry.wait_ms(exc, failures, elapsed_ms, self._streaks.get(partition, 0))
                if wait_ms is None:
                    if failures > 1:
                        self._streaks[partition] = self._streaks.get(partition, 0) + 1
                    return replies.give_up(topic, exc, failures, elapsed_ms)
                log.info("reply to %r failed (%r); try %d in %d ms", topic, exc, failures + 1, wait_ms)
                await asyncio.sleep(wait_ms / 1000)

    async def _exists(self, topic: str) -> bool:
        """Whether ``topic`` exists; lists the cluster's topics again (at most once per refresh interval, one listing
        for every partition waiting) when the view is older than the records being routed."""
        while (presence := self.topics.presence(topic, self._received_ms)) is Presence.UNKNOWN:
            async with self._listing:
                if self.topics.presence(topic, self._received_ms) is Presence.UNKNOWN:
                    await asyncio.sleep(self.topics.wait_ms() / 1000)
                    listed_ms = self.clock.now_ms()
                    self.topics.update(await self.list_topics(), listed_ms)
        return presence is Presence.EXISTS

    async def _produce_reply(self, delivery: Delivery, elapsed_ms: int) -> None:
        await send_reply(
            self.producer,
            delivery.reply_topic,
            delivery.reply_value,
            delivery.reply_key,
            [*kafka.headers(delivery.reply_content_type), (HEADER_DELIVERY, delivery.delivered_key.encode())],
            self.retry.try_timeout_ms(elapsed_ms, self.settings.router.reply_metadata_timeout_ms),
        )

    async def _store(self, delivery: Delivery) -> bool:
        """Store the retrieval copy; True unless one was stored before (False for a copy's answer: never stored). A
        write Redis refuses (maxmemory) costs only that copy: no delivery reads it, so routing goes on instead of
        retrying the partition."""
        if delivery.store is None:
            return False
        try:
            stored = await self.results.put(delivery.tenant_id, delivery.request_id, delivery.store)
        except ResponseError as exc:
            log.warning(
                "storing the result of %s was refused: %s",
                delivery.request_id,
                exc,
                extra={"request_id": delivery.request_id},
            )
            self._count_dropped("refused")
            return True
        self._count_dropped("tenant_bound", stored.dropped)
        if stored.first and not stored.kept:
            self._count_dropped("too_large")
        return stored.first

    def _count_dropped(self, reason: str, count: int = 1) -> None:
        if self.metrics is not None and count:
            self.metrics.stored_dropped.labels(reason).inc(count)

    def _count_reply_dead_letter(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.reply_dead_letters.labels(kind).inc()

    async def _dead_letter(
        self, record, reason: str, reply_topic: str | None = None, letter: kafka.Letter | None = None
    ) -> None:
        """Dead-letter ``letter`` (the consumed ``record`` itself when None) with ``reason``."""
        if reply_topic is None or self.log_gate.allow(reply_topic):  # a producer may invent any number of topics
            log.warning("dead-lettering record at %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason)
        elif self.metrics is not None:
            self.metrics.log_lines_suppressed.inc()
        await kafka.dead_letter(
            self.producer, letter or record, reason, topic=self.names.dead_letters_topic, reply_topic=reply_topic
        )


def _unsent(delivery: Delivery, record) -> kafka.Letter:
    """What is dead-lettered for a reply that cannot be sent: the reply itself, as the producer would have read it (its
    format, JSON or msgpack, and its own request id as the key), with the result record's other headers (trace)."""
    others = [(name, value) for name, value in record.headers or () if name != kafka.HEADER_CONTENT_TYPE]
    return kafka.Letter(
        value=delivery.reply_value,
        key=delivery.reply_key,
        headers=[*others, *kafka.headers(delivery.reply_content_type)],
    )

"""The pod's I/O edges: the Kafka producer, the Redis reply/heartbeat subscription, cancels and the pod heartbeat.

:class:`Pod` owns them and wires the services the HTTP routes call (see :mod:`llmq_api.generation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import msgspec
from redis.asyncio import Connection, ConnectionPool, Redis

from llmq_api import health
from llmq_api.admission import ShedPolicy
from llmq_api.auth import KeyStore
from llmq_api.batch_jobs.batches import BatchJobs
from llmq_api.batch_jobs.builder import JobBuilder
from llmq_api.batch_jobs.files import BatchFiles
from llmq_api.batch_jobs.message_batches import MessageBatches
from llmq_api.cancels import CancelSender
from llmq_api.catalog import ModelCatalog
from llmq_api.gateway import Gateway, RequestProducer
from llmq_api.generation import Generation
from llmq_api.health import KAFKA, REDIS, CircuitBreaker, Dependency
from llmq_api.idempotency import IdempotencyStore
from llmq_api.metrics import ApiMetrics
from llmq_api.ratelimit import RateLimiter
from llmq_api.resume import StreamHolds
from llmq_api.saturation import SaturationMonitor
from llmq_api.waiters import Dispatched, WaiterRegistry
from llmq_core import constants, kafka, runtime, tracing, wire
from llmq_core.clock import SYSTEM_CLOCK, Clock, Sleep
from llmq_core.labels import LabelSet
from llmq_core.names import Names
from llmq_core.redis_client import check_memory_policy, make_redis
from llmq_core.settings import Settings
from llmq_core.token_counts import load_counters
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog
from llmq_jobs.store import JobStore

log = logging.getLogger(__name__)

RETRY_CONNECT_S = 1.0
REDIS_OP_TIMEOUT_S = 1.0
CLOSE_TIMEOUT_S = 2.0
POLL_S = 1.0  # a replies connection quiet this long is PINGed; quiet twice as long, it is dead


class KafkaRequestProducer:
    """Produces GenerationRequests to ``names.request_topic(traffic_class)`` (key = request_id, msgpack).

    :meth:`run` (re)tries starting the producer until the broker answers; ``ready`` is True from then on. A producer
    that broke (a refused record, a sequence gap left by a broker outage) replaces itself: see kafka.RenewableProducer.
    Starts and failures to start are reported to ``breaker`` (the gateway reports each produce), and every
    ``api_kafka_check_interval_ms`` the client is asked to reach a broker (unless requests were acked meanwhile): so the
    breaker opens without waiting for a request to fail, and closes within one interval of the broker's return, without
    waiting out its backoff or for a request (an idle pod, say one a global load balancer failed over, recovers by
    itself). ``sleep`` waits between
    start attempts and between checks (injected: tests step it).
    """

    def __init__(
        self,
        settings: Settings,
        breaker: CircuitBreaker | None = None,
        sleep: Sleep = asyncio.sleep,
        names: Names = Names(),
    ) -> None:
        self._settings = settings
        self._names = names
        self._breaker = breaker
        self._sleep = sleep
        # its topics (requests, the batch-job log) are llmq's own: records behind one in flight go out together
        self._producer = kafka.make_renewable_producer(settings, max_batch_size=settings.kafka.producer_max_batch_bytes)
        self.ready = False
        self._acked = 0  # requests the broker acknowledged: while they count up, the health check is not needed

    @property
    def kafka(self) -> kafka.RenewableProducer:
        """The producer itself (the batch-job log writes through it)."""
        return self._producer

    async def run(self) -> None:
        await self._start()
        await self._watch()

    async def _start(self) -> None:
        while True:
            try:
                await self._producer.start()
                break
            except Exception as exc:
                log.warning("Kafka producer not started (%r); retrying in %.0fs", exc, RETRY_CONNECT_S)
                self._report(f"the Kafka producer could not start: {exc!r}"[:200])
                await self._sleep(RETRY_CONNECT_S)
        self.ready = True
        log.info("Kafka producer ready")
        self._report(None)

    async def _watch(self) -> None:
        if self._breaker is None:
            return
        timeout_s = self._settings.api.produce_timeout_ms / 1000
        acked = self._acked
        while True:  # a metadata request costs the broker little: check through the backoff too, so a pod
            await self._sleep(self._settings.api.kafka_check_interval_ms / 1000)  # closes within one interval
            if self._acked != acked:  # requests were acked meanwhile: a broker is reached, and the metadata (a
                acked = self._acked  # decode of every topic's, once a second) would tell nothing more
                continue
            connected = await self.reachable(timeout_s)
            self._report(None if connected else "the Kafka client reaches no broker")

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the producer's client fetches cluster metadata from a broker within ``timeout_s``."""
        return await self._producer.reachable(timeout_s)

    def _report(self, failure: str | None) -> None:
        if self._breaker is None:
            return
        if failure is None:
            self._breaker.succeeded()
        else:
            self._breaker.failed(failure)

    async def produce(self, request: wire.GenerationRequest) -> None:
        if not self.ready:
            raise ConnectionError("Kafka producer is not started")
        await self._send(request)
        self._acked += 1

    async def _send(self, request: wire.GenerationRequest) -> None:
        topic = self._names.request_topic(request.traffic_class)
        if not tracing.enabled():
            await kafka.send_message(self._producer, topic, request, key=request.request_id)
            return
        attributes = tracing.request_attributes(request)
        tracing.annotate_current(attributes)  # the server span of this HTTP request
        span = tracing.start_span(
            "kafka.produce",
            kind=tracing.SpanKind.PRODUCER,
            attributes={**attributes, "messaging.destination.name": topic},
        )
        traceparent = tracing.traceparent_of(span)
        try:  # the context travels in the record's header and, for the hops after Batches, in the request itself
            await kafka.send_message(
                self._producer,
                topic,
                msgspec.structs.replace(request, traceparent=traceparent),
                key=request.request_id,
                traceparent=traceparent,
            )
        finally:
            span.end()

    async def stop(self) -> None:
        self.ready = False
        await self._producer.stop()


def replies_connection(pool: ConnectionPool) -> Connection:
    """A new, unconnected RESP2 connection like ``pool``'s, without health checks or maintenance notifications (RESP3
    pushes: redis-py refuses them on a RESP2 connection that parses without hiredis)."""
    kwargs = {**pool.connection_kwargs, "protocol": 2, "health_check_interval": 0, "maint_notifications_config": None}
    return pool.connection_class(**kwargs)


class ReplyListener:
    """One Redis pub/sub connection: the pod's replies channel feeds the waiters, the heartbeats channel the catalog.

    ``subscribed`` is True while the replies channel subscription is confirmed; ``health`` (the ``redis``
    :class:`~llmq_api.health.Dependency`) records it with since-when and why it was lost. After every (re)subscription
    the results of requests still waiting are looked up in the result store, in case they were published while the
    subscription was down.
    """

    def __init__(
        self,
        redis: Redis,
        instance_id: str,
        registry: WaiterRegistry,
        catalog: ModelCatalog,
        metrics: ApiMetrics,
        health: Dependency | None = None,
        heartbeats_channel: str = constants.REDIS_HEARTBEATS_CHANNEL,
    ) -> None:
        self._redis = redis
        self._replies = constants.replies_channel(instance_id)
        self._replies_bytes = self._replies.encode()
        self._heartbeats = heartbeats_channel
        self._channels = {c.encode(): c for c in (self._replies, heartbeats_channel)}
        self._registry = registry
        self._catalog = catalog
        self._metrics = metrics
        self.health = health or Dependency(REDIS, SYSTEM_CLOCK)

    @property
    def subscribed(self) -> bool:
        return self.health.up

    @subscribed.setter
    def subscribed(self, value: bool) -> None:
        self.health.mark(value, None if value else "the replies subscription is not confirmed")

    async def run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Redis subscription lost (%r); resubscribing in %.0fs", exc, RETRY_CONNECT_S)
                self.health.mark(False, f"the replies subscription was lost: {exc!r}"[:200])
            await asyncio.sleep(RETRY_CONNECT_S)

    async def _listen(self) -> None:
        """Subscribe on a connection of its own and read it directly: per message one parse (hiredis) and one
        dispatch, without PubSub's layers (health check, retry wrapper, message dict) that cost a pod more CPU per
        reply than the rest of its reply path. RESP2: a message is a plain array, no push handling. A quiet
        ``POLL_S`` sends a PING; a second one with nothing received (no PONG, no heartbeat) means the connection is
        dead: it is dropped and the subscription made again."""
        connection = replies_connection(self._redis.connection_pool)
        try:
            await connection.connect()
            await connection.send_command("SUBSCRIBE", self._replies, self._heartbeats)
            pinged = False
            while True:
                response = await connection.read_response(timeout=POLL_S, disconnect_on_error=False)
                if response is not None:
                    pinged = False
                    await self._handle(response)
                elif pinged:
                    raise ConnectionError(f"Redis answered no PING within {POLL_S:g} s")
                else:
                    await connection.send_command("PING", check_health=False)
                    pinged = True
        finally:
            self.subscribed = False
            with contextlib.suppress(Exception):
                await connection.disconnect()

    async def _handle(self, response: list) -> None:
        """One RESP2 pub/sub array: ``[b"message", channel, data]``, ``[b"subscribe", channel, count]`` or a PONG."""
        kind, channel = response[0], response[1]
        if kind == b"message":
            self.deliver(self._channels.get(channel, ""), response[2])
        elif kind == b"subscribe" and channel == self._replies_bytes:
            self.subscribed = True
            await self._recover()

    def deliver(self, channel: str, data: bytes) -> None:
        """Decode one pub/sub payload and hand it to the waiters (replies) or the catalog (heartbeats)."""
        try:
            decoded = wire.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("undecodable message on %s: %s", channel, exc)
            return
        if channel == self._replies and isinstance(decoded, (wire.TokenChunk, wire.FinalResult)):
            dispatched = self._registry.dispatch(decoded)
            if dispatched is Dispatched.FORGED:
                log.warning("dropping a reply naming another tenant", extra={"request_id": decoded.request_id})
                self._metrics.forged_replies.inc()
            elif not dispatched:
                self._metrics.dropped_replies.inc()
        elif isinstance(decoded, wire.WorkerHeartbeat):
            self._catalog.observe(decoded)

    async def _recover(self) -> None:
        request_ids = self._registry.request_ids()
        if not request_ids:
            return
        try:
            stored = await self._redis.mget([constants.result_key(r) for r in request_ids])
        except Exception as exc:
            log.warning("result recovery failed: %r", exc)
            return
        for data in filter(None, stored):
            self.deliver(self._replies, data)


async def pod_heartbeat(redis: Redis, instance_id: str, clock: Clock, interval_ms: int, ttl_ms: int) -> None:
    """SET ``pod_key(instance_id)`` to a PodHeartbeat (PX ``ttl_ms``) every ``interval_ms`` until cancelled."""
    key = constants.pod_key(instance_id)
    while True:
        beat = wire.PodHeartbeat(instance_id=instance_id, sent_ms=clock.now_ms())
        try:
            async with asyncio.timeout(REDIS_OP_TIMEOUT_S):  # not wait_for: 3.11's can swallow this loop's cancel
                await redis.set(key, wire.encode(beat), px=ttl_ms)
        except Exception as exc:  # Redis down: keep serving; the batcher may treat the pod as gone meanwhile
            log.warning("pod heartbeat failed: %r", exc)
        await asyncio.sleep(interval_ms / 1000)


class Pod:
    """One API pod, wired: settings, clients, background loops, and the parts its routes use (``generation``,
    ``keys``, ``catalog``, ``metrics``, ``batch_files``, ``batch_jobs``, the probes :meth:`readiness` and :attr:`dependencies`).

    ``keys`` defaults to :meth:`KeyStore.from_settings` (raises ValueError for a bad keys file); ``names``: the Redis
    keys it reads, such as the hash of the batchers' reports (tests pass private ones).
    """

    def __init__(
        self,
        settings: Settings,
        instance_id: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        producer: RequestProducer | None = None,
        keys: KeyStore | None = None,
        redis: Redis | None = None,
        names: Names = Names(),
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.clock = clock
        self.draining = False
        self.registry = WaiterRegistry(settings.api.max_in_flight)
        self.catalog = ModelCatalog(clock)
        self.token_counters = load_counters(settings)  # each model's tokenizer: prompt tokens, context checks, cost
        self.metrics = ApiMetrics(lambda: len(self.registry), LabelSet.from_settings(settings))
        self.keys = keys or KeyStore.from_settings(settings)
        self.redis = redis or make_redis(settings, socket_timeout=2, socket_connect_timeout=2, health_check_interval=10)
        self.names = names
        # a client of their own (one connection, only ever one group in flight): the shared pool may be all taken
        cancels_redis = redis or make_redis(settings, max_connections=1, socket_timeout=2, socket_connect_timeout=2)
        self.cancels = CancelSender(cancels_redis, names.cancels_channel, self.metrics, settings.api.max_in_flight)
        self.saturation = SaturationMonitor(
            self.redis,
            clock,
            settings.api.saturation_stale_ms,
            key=names.saturation_key,
            heard_ms=self.catalog.heard_ms,
            instance_id=instance_id,
        )
        self.limiter = RateLimiter(self.redis, clock, settings.api.rate_limit_timeout_ms / 1000)
        self.breaker = CircuitBreaker(
            Dependency(KAFKA, clock),
            clock,
            backoff_ms=settings.api.kafka_breaker_backoff_ms,
            max_backoff_ms=settings.api.kafka_breaker_max_backoff_ms,
            probe_timeout_ms=settings.api.produce_timeout_ms,
        )
        self.producer = producer or KafkaRequestProducer(settings, self.breaker, names=names)
        self.listener = ReplyListener(
            self.redis,
            instance_id,
            self.registry,
            self.catalog,
            self.metrics,
            Dependency(REDIS, clock),
            heartbeats_channel=names.heartbeats_channel,
        )
        self.generation = self._generation()
        store, files = JobStore(self.redis, log=self._job_log()), FileStore(settings.jobs.files_url)
        self.batch_files = BatchFiles(settings, store, files, clock, self.limiter)
        builder = JobBuilder(
            settings, store, files, clock, self.catalog.context_windows, self.limiter, self.token_counters
        )
        self.batch_jobs, self.message_batches = BatchJobs(builder), MessageBatches(builder)
        self.metrics.track_dependencies(self.dependencies)
        self._tasks: list[asyncio.Task] = []

    def _job_log(self) -> JobLog | None:
        """The batch-job log, through this pod's Kafka producer (a test's stand-in producer: none)."""
        return JobLog(self.producer.kafka) if isinstance(self.producer, KafkaRequestProducer) else None

    def _generation(self) -> Generation:
        gateway = Gateway(
            instance_id=self.instance_id,
            registry=self.registry,
            producer=self.producer,
            publish_cancel=self.cancels.publish,
            clock=self.clock,
            produce_timeout_ms=self.settings.api.produce_timeout_ms,
            accepting=lambda: self.accepting,
            breaker=self.breaker,
        )
        return Generation(
            gateway=gateway,
            store=IdempotencyStore(self.redis, self.clock, self.settings.result_store.ttl_s * 1000),
            registry=self.registry,
            shed=ShedPolicy.from_settings(self.settings),
            saturation=self.saturation,
            limiter=self.limiter,
            catalog=self.catalog,
            metrics=self.metrics,
            publish_cancel=self.cancels.publish,
            clock=self.clock,
            holds=StreamHolds(
                self.redis, self.instance_id, self.settings.api.stream_resume_window_ms, self.cancels.publish
            ),
        )

    @property
    def accepting(self) -> bool:
        """Kafka producer started, replies subscription confirmed, not draining (the breaker decides the rest)."""
        return self.producer.ready and self.listener.subscribed and not self.draining

    @property
    def dependencies(self) -> list[Dependency]:
        """Kafka (the breaker's view, and the producer's starts) and Redis (the replies subscription)."""
        return [self.breaker.dependency, self.listener.health]

    def readiness(self) -> tuple[bool, dict]:
        """Whether the pod is ready (see :func:`llmq_api.health.report`), and the body of ``/readyz`` that says why."""
        ready, body = health.report(self.dependencies, self.draining)
        checks = {
            "kafka_producer": self.producer.ready,
            "replies_subscription": self.listener.subscribed,
            "draining": self.draining,
        }
        return ready, {**body, **checks}

    async def start(self) -> None:
        """Start the background loops (they keep retrying their connections; see :attr:`accepting`)."""
        settings = self.settings
        loops = [
            self.listener.run(),
            pod_heartbeat(
                self.redis,
                self.instance_id,
                self.clock,
                settings.api.pod_heartbeat_interval_ms,
                settings.api.pod_heartbeat_ttl_ms,
            ),
            runtime.keep_alive(
                self.redis, "api", self.instance_id, {"pid": os.getpid()}, settings.api.pod_heartbeat_interval_ms
            ),
            self.producer.run(),
            self.saturation.run(),
            check_memory_policy(self.redis, "api"),
        ]
        self._tasks = [asyncio.create_task(loop) for loop in loops]

    async def stop(self) -> None:
        """Stop the loops, drop the pod's keys and close the clients."""
        self.draining = True
        await asyncio.gather(runtime.cancel_and_wait(self._tasks), self.generation.stop(), return_exceptions=True)
        with contextlib.suppress(Exception):  # refunds of requests that just ended (each bounded)
            await self.limiter.drain()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.redis.delete(constants.pod_key(self.instance_id), constants.alive_key("api", self.instance_id)),
                REDIS_OP_TIMEOUT_S,
            )
        with contextlib.suppress(Exception):  # bounded: a dead broker must not hold up the exit
            await asyncio.wait_for(self.producer.stop(), CLOSE_TIMEOUT_S)
        await self.cancels.stop(CLOSE_TIMEOUT_S)  # after the drain: the Cancels of what it ended go out too
        if self.cancels.redis is not self.redis:
            await self.cancels.redis.aclose()
        await self.redis.aclose()

"""Kafka clients as every llmq service configures them (aiokafka), and topic creation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.helpers import create_ssl_context

from llmq_core import wire
from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.constants import (
    CONTENT_TYPE_MSGPACK,
    HEADER_CONTENT_TYPE,
    HEADER_ERROR,
    HEADER_ERROR_MAX_BYTES,
    HEADER_REPLY_TOPIC,
    HEADER_TRACEPARENT,
    JOB_TOPIC_KINDS,
    KAFKA_INTERNAL_TOPIC_PREFIX,
    KAFKA_MAX_MESSAGE_BYTES,
    KAFKA_TOPICS_READY_POLL_S,
    REQUEST_TOPICS,
    TOPIC_BATCHES,
    TOPIC_DEAD_LETTERS,
    TOPIC_JOBS_PREFIX,
    TOPIC_PREFIX,
    TOPIC_RESULTS,
    ingress_topic,
)
from llmq_core.requests import echo
from llmq_core.settings import IngressGrant, Settings, secret

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES_CONFIG = "max.message.bytes"  # a topic's record (batch) limit on the broker
# The broker (or the client's own max_request_size check) refuses this one record for good: retrying cannot help.
RECORD_TOO_LARGE_ERRORS = (errors.MessageSizeTooLargeError, errors.RecordTooLargeError, errors.RecordListTooLargeError)
RECORD_REFUSED_ERRORS = (
    *RECORD_TOO_LARGE_ERRORS,
    errors.CorruptRecordException,
    errors.InvalidTopicError,
    errors.TopicAuthorizationFailedError,
    errors.PolicyViolationError,
)
# aiokafka's sender task dies on these and every later send of that producer fails the same way: only a new one helps.
BROKEN_PRODUCER_ERRORS = (errors.OutOfOrderSequenceNumber, errors.ProducerFenced)
PRODUCER_RENEW_RETRY_MS = 1000  # after a fresh producer failed to start (broker away), the next try waits this long
PRODUCER_CLOSE_TIMEOUT_S = 5.0  # a replaced producer's flush of its other records, at most


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def is_valid_topic_name(name: str) -> bool:
    """Whether Kafka accepts ``name`` as a topic: 1-249 of ``[A-Za-z0-9._-]``, and not ``.`` or ``..``. Producing to any
    other name fails (aiokafka keeps retrying the metadata request until its timeout), so check before producing."""
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")


def reply_topic_prefixes(settings: Settings) -> tuple[str, ...]:
    """Settings.kafka.reply_topic_prefixes as a tuple; empty: any topic :func:`reply_topic_error` does not refuse."""
    return settings.kafka.reply_prefixes()


def reply_topic_error(topic: str, allowed_prefixes: tuple[str, ...] = ()) -> str | None:
    """Why results must not be produced to ``topic`` (None: they may). Refused: illegal names, Kafka's internal topics
    (``__*``), llmq's own topics (``llmq.*``: results there would poison its requests, batches or results), and, when
    ``allowed_prefixes`` is not empty, any topic outside them."""
    if not is_valid_topic_name(topic):
        return f"reply_to.topic {echo(topic)} is not a valid Kafka topic name"
    if topic.startswith(KAFKA_INTERNAL_TOPIC_PREFIX):
        return f"reply_to.topic {echo(topic)} is one of Kafka's internal topics"
    if topic.startswith(TOPIC_PREFIX):
        return f"reply_to.topic {echo(topic)} is reserved for llmq itself (prefix {TOPIC_PREFIX!r})"
    if allowed_prefixes and not topic.startswith(allowed_prefixes):
        return f"reply_to.topic {echo(topic)} does not start with an allowed prefix ({', '.join(allowed_prefixes)})"
    return None


def client_options(settings: Settings) -> dict:
    """The connection options of every Kafka client llmq makes (producer, consumer, admin): bootstrap servers and,
    past PLAINTEXT, TLS (CA, client certificate for mTLS) and SASL credentials. The one place they are built."""
    options: dict = {"bootstrap_servers": settings.kafka.bootstrap_servers}
    protocol = settings.kafka.security_protocol
    if protocol == "PLAINTEXT":
        return options
    options["security_protocol"] = protocol
    options["ssl_context"] = create_ssl_context(
        cafile=settings.kafka.ssl_cafile or None,
        certfile=settings.kafka.ssl_certfile or None,
        keyfile=settings.kafka.ssl_keyfile or None,
    )
    if protocol == "SASL_SSL":
        options["sasl_mechanism"] = settings.kafka.sasl_mechanism
        options["sasl_plain_username"] = settings.kafka.sasl_username
        options["sasl_plain_password"] = secret(settings.kafka.sasl_password, settings.kafka.sasl_password_file)
    return options


def make_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client (unstarted). On a secure cluster only the admin principal may create topics or ACLs."""
    return AIOKafkaAdminClient(**client_options(settings))


PRODUCER_REQUEST_TIMEOUT_MS = 10_000  # one produce request; aiokafka bounds a send by twice this


def make_producer(settings: Settings, **overrides) -> AIOKafkaProducer:
    """An idempotent producer (acks=all) that lingers ``kafka.producer_linger_ms``, of records up to
    KAFKA_MAX_MESSAGE_BYTES. ``overrides``: AIOKafkaProducer's options (e.g. ``max_batch_size``)."""
    options = dict(
        **client_options(settings),
        acks="all",
        enable_idempotence=True,
        linger_ms=settings.kafka.producer_linger_ms,
        request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
        max_request_size=KAFKA_MAX_MESSAGE_BYTES,
    )
    options.update(overrides)
    return AIOKafkaProducer(**options)


class RenewableProducer:
    """A producer that replaces itself (``factory`` makes each, unstarted) once it can no longer send.

    aiokafka's idempotent producer never takes back the sequence number of a record the broker refused
    (RECORD_REFUSED_ERRORS: too large for the topic, invalid topic, policy...): the next record of that partition is
    then refused as out of order, which kills the sender task, and every later send fails (BROKEN_PRODUCER_ERRORS).
    A fresh producer gets a new producer id whose sequence numbers start over, so after either the producer is
    replaced (once, however many sends saw it fail) before the next send. The error is still raised: the caller
    decides whether its record is refused for good or tried again. A refusal raised before the record is queued (the
    client's own max_request_size check) took no sequence number and replaces nothing. While no fresh producer starts
    (broker away), sends go to the broken one (they fail at once) and a new start is tried at most every
    ``renew_retry_ms``.

    Offers what llmq calls of AIOKafkaProducer: start, stop, send, send_and_wait, partitions_for, client.
    """

    def __init__(
        self,
        factory: Callable[[], AIOKafkaProducer],
        *,
        clock: Clock = SYSTEM_CLOCK,
        renew_retry_ms: int = PRODUCER_RENEW_RETRY_MS,
    ) -> None:
        self._factory = factory
        self._clock = clock
        self._renew_retry_ms = renew_retry_ms
        self._producer: AIOKafkaProducer | None = None
        self._stale = False  # the current producer cannot send any more: replace it before the next send
        self._next_try_ms = 0
        self._renewing = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()  # replaced producers being stopped
        self.renewals = 0

    async def start(self) -> None:
        """Start a fresh producer; if that fails it is stopped and the error raised (call again to retry)."""
        producer = self._factory()
        try:
            await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        await asyncio.gather(*self._closing)
        if self._producer is not None:
            await self._producer.stop()

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the current producer's client fetches cluster metadata from a broker within ``timeout_s``."""
        producer = self._producer
        if producer is None:
            return False
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: 3.11's can swallow a watching loop's cancel
                return bool(await producer.client.force_metadata_update())
        except Exception:
            return False

    async def partitions_for(self, topic: str) -> set[int]:
        return await (await self._usable()).partitions_for(topic)

    @property
    def client(self):
        """The current producer's AIOKafkaClient (cluster metadata)."""
        if self._producer is None:
            raise errors.ProducerClosed()
        return self._producer.client

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable:
        """Queue one record; returns an awaitable of its RecordMetadata, like AIOKafkaProducer.send."""
        producer = await self._usable()
        try:
            ack = await producer.send(
                topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
            )
        except BROKEN_PRODUCER_ERRORS:
            await self._broke(producer)
            raise
        return self._acked(producer, ack)

    async def send_and_wait(self, *args, **kwargs):
        """Produce one record (:meth:`send`'s arguments) and wait for its RecordMetadata. A record the broken producer
        could not send (BROKEN_PRODUCER_ERRORS: the broker never wrote it) goes once more through its replacement."""
        try:
            return await (await self.send(*args, **kwargs))
        except BROKEN_PRODUCER_ERRORS:
            return await (await self.send(*args, **kwargs))

    async def _acked(self, producer: AIOKafkaProducer, ack: Awaitable):
        try:
            return await ack
        except (*BROKEN_PRODUCER_ERRORS, *RECORD_REFUSED_ERRORS):  # refused by the broker: its sequence number is spent
            await self._broke(producer)
            raise

    async def _usable(self) -> AIOKafkaProducer:
        if self._stale:
            await self._renew()
        if self._producer is None:
            raise errors.ProducerClosed()
        return self._producer

    async def _broke(self, producer: AIOKafkaProducer) -> None:
        if producer is self._producer:  # not one replaced already
            self._stale = True
            await self._renew()

    async def _renew(self) -> None:
        async with self._renewing:
            if not self._stale or self._clock.now_ms() < self._next_try_ms:
                return
            old = self._producer
            try:
                await self.start()
            except Exception as exc:
                self._next_try_ms = self._clock.now_ms() + self._renew_retry_ms
                log.warning("starting a fresh Kafka producer failed (%r); next try in %d ms", exc, self._renew_retry_ms)
                return
            self._stale = False
            self.renewals += 1
            log.warning("replaced the Kafka producer after it refused a record or broke (%d so far)", self.renewals)
        # In the background: the old one flushes its other records (those that fail are retried by their senders).
        closing = asyncio.create_task(_stop_quietly(old))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), PRODUCER_CLOSE_TIMEOUT_S)


def make_renewable_producer(settings: Settings, **overrides) -> RenewableProducer:
    """A :class:`RenewableProducer` of :func:`make_producer` producers."""
    return RenewableProducer(lambda: make_producer(settings, **overrides))


def make_consumer(settings: Settings, *topics: str, group_id: str | None, **overrides) -> AIOKafkaConsumer:
    """A consumer that commits by hand (at-least-once) and starts at the earliest uncommitted record; it fetches records
    of up to KAFKA_MAX_MESSAGE_BYTES."""
    options = dict(
        **client_options(settings),
        max_partition_fetch_bytes=KAFKA_MAX_MESSAGE_BYTES,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=500,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
        rebalance_timeout_ms=10_000,
    )
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


def headers(content_type: str = CONTENT_TYPE_MSGPACK) -> list[tuple[str, bytes]]:
    return [(HEADER_CONTENT_TYPE, content_type.encode())]


async def send_message(
    producer: AIOKafkaProducer,
    topic: str,
    message: wire.Message,
    *,
    key: str | None = None,
    partition: int | None = None,
    content_type: str = CONTENT_TYPE_MSGPACK,
    traceparent: str | None = None,
):
    """Produce one wire message and wait for the broker's acknowledgement. Returns its RecordMetadata.

    ``traceparent``: W3C trace context for the record's ``traceparent`` header (None: no header).
    """
    record_headers = headers(content_type)
    if traceparent is not None:
        record_headers.append((HEADER_TRACEPARENT, traceparent.encode()))
    return await producer.send_and_wait(
        topic,
        wire.encode(message, content_type),
        key=key.encode() if key else None,
        partition=partition,
        headers=record_headers,
    )


async def cluster_topics(producer: AIOKafkaProducer) -> set[str]:
    """Every topic of the cluster, from one metadata request on the producer's connections (its own metadata, and so
    the topics aiokafka tracks and refreshes, stays as it is). On a cluster with ACLs: those the principal may see."""
    return (await producer.client.fetch_all_metadata()).topics()


@dataclass(frozen=True, slots=True)
class Letter:
    """A record to dead-letter that was never consumed (a consumed aiokafka record has the same three fields)."""

    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]


async def dead_letter(
    producer: AIOKafkaProducer,
    record: Letter,
    reason: str,
    *,
    topic: str = TOPIC_DEAD_LETTERS,
    reply_topic: str | None = None,
) -> None:
    """Produce ``record`` (value, key and headers as they came) to ``topic``, with why in its ``HEADER_ERROR`` header
    and, for a result that could not be replied, the reply topic it could not reach. Raises what the send raises."""
    letter_headers = [*(record.headers or ()), (HEADER_ERROR, reason.encode()[:HEADER_ERROR_MAX_BYTES])]
    if reply_topic is not None:
        letter_headers.append((HEADER_REPLY_TOPIC, reply_topic.encode()))
    await producer.send_and_wait(topic, record.value, key=record.key, headers=letter_headers)


def ingress_grants(settings: Settings) -> dict[str, IngressGrant]:
    """Each configured Kafka-direct producer's ingress topic -> what its records speak for (Settings.kafka.ingress)."""
    return {ingress_topic(principal): grant for principal, grant in settings.kafka.ingress.items()}


def topic_layout(settings: Settings) -> dict[str, int]:
    """Every llmq topic and its partition count (the ingress topics of Kafka-direct producers included)."""
    layout = {topic: settings.kafka.request_topic_partitions for topic in [*REQUEST_TOPICS, *ingress_grants(settings)]}
    layout[TOPIC_BATCHES] = settings.kafka.batch_topic_partitions
    layout[TOPIC_RESULTS] = settings.kafka.results_topic_partitions
    layout[TOPIC_DEAD_LETTERS] = 1
    layout.update({f"{TOPIC_JOBS_PREFIX}{kind}": 1 for kind in JOB_TOPIC_KINDS})  # read in order when rebuilt
    return layout


def topic_config(topic: str) -> dict[str, str]:
    """The configs llmq creates ``topic`` with: room for its largest record; the batch-job state topics compacted (the
    latest record of each key is the state)."""
    config = {MAX_MESSAGE_BYTES_CONFIG: str(KAFKA_MAX_MESSAGE_BYTES)}
    if topic.startswith(TOPIC_JOBS_PREFIX):
        config["cleanup.policy"] = "compact"
    return config


async def create_topic(settings: Settings, topic: str, partitions: int = 1) -> bool:
    """Create ``topic`` with room for llmq's largest record (replication factor 1: local and test stacks); False when
    it exists already. Reply topics are created this way by their owners: the broker does not auto-create topics."""
    admin = make_admin(settings)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=topic_config(topic))])
        _raise_refusals(response)
        await await_ready(admin, [topic], settings.kafka.topics_ready_timeout_s, raise_on_timeout=True)
    finally:
        await admin.close()
    [(_, code, *_)] = response.topic_errors
    return not code


def _raise_refusals(response, detail: str = "") -> None:
    """Raise the error of the first topic a CreateTopics ``response`` refuses; one that exists already is no refusal.
    The broker answers per topic, so a refusal (e.g. more replicas than brokers) must not pass for success."""
    for topic, code, *_ in response.topic_errors:
        if code and code != errors.TopicAlreadyExistsError.errno:
            raise errors.for_code(code)(f"creating topic {topic!r}{detail}")


class TopicLimitError(RuntimeError):
    """A topic's max.message.bytes on the broker is below what llmq's records need."""


async def ensure_topics(settings: Settings, *, raise_limits: bool = False) -> None:
    """Create the llmq topics that do not exist yet (``topic_replication_factor`` replicas) with max.message.bytes
    = KAFKA_MAX_MESSAGE_BYTES. ``raise_limits``: also raise that limit on existing topics below it (local stacks only:
    in production the topics' owners set it, and :func:`check_topic_limits` refuses to start without it)."""
    limit = {MAX_MESSAGE_BYTES_CONFIG: str(KAFKA_MAX_MESSAGE_BYTES)}
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        layout = topic_layout(settings)
        replicas = settings.kafka.topic_replication_factor
        missing = [
            NewTopic(t, n, replicas, topic_configs=topic_config(t)) for t, n in layout.items() if t not in existing
        ]
        if missing:
            _raise_refusals(await admin.create_topics(missing), f" with {replicas} replicas")
            log.info("created topics %s", [t.name for t in missing])
        low = [
            t
            for t, v in (await _topic_limits(admin, [t for t in layout if t in existing])).items()
            if v < KAFKA_MAX_MESSAGE_BYTES
        ]
        if raise_limits and low:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, limit) for t in low])
            log.info("raised %s of %s to %d", MAX_MESSAGE_BYTES_CONFIG, low, KAFKA_MAX_MESSAGE_BYTES)
        await await_ready(admin, list(layout), settings.kafka.topics_ready_timeout_s, raise_on_timeout=True)
    finally:
        await admin.close()


async def await_topics(settings: Settings, topics: list[str], timeout_s: float | None = None) -> None:
    """At a consumer's start: wait (at most ``timeout_s``, default ``kafka.topics_ready_timeout_s``) until
    ``settings``' principal sees a leader for every partition of ``topics``; past the bound, log which are not ready
    and go on (the consumer takes them up at its next metadata refresh)."""
    admin = make_admin(settings)
    await admin.start()
    try:
        bound_s = settings.kafka.topics_ready_timeout_s if timeout_s is None else timeout_s
        await await_ready(admin, topics, bound_s, raise_on_timeout=False)
    finally:
        await admin.close()


async def await_group(settings: Settings, group_id: str, members: int, timeout_s: float, poll_s: float = 0.2) -> None:
    """Wait until consumer group ``group_id`` is Stable with ``members`` members (a rebalance after a member died or
    joined is over: every partition is assigned again). TimeoutError past ``timeout_s``."""
    admin = make_admin(settings)
    await admin.start()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                (response,) = await admin.describe_consumer_groups([group_id])
                (group,) = response.groups  # (error, group, state, protocol type, protocol, members, ...)
                if group[2] == "Stable" and len(group[5]) == members:
                    return
                await asyncio.sleep(poll_s)
    finally:
        await admin.close()


def topics_not_ready(described: list[dict]) -> list[str]:
    """The topics of a metadata answer (``describe_topics``) that a consumer would leave out of its assignment: an
    error (unknown, not authorized, no leader yet), no partitions, or a partition without a leader."""
    return sorted(
        t["topic"]
        for t in described
        if t["error_code"] or not t["partitions"] or any(p["leader"] < 0 for p in t["partitions"])
    )


async def await_ready(admin: AIOKafkaAdminClient, topics: list[str], timeout_s: float, *, raise_on_timeout: bool):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pending := topics_not_ready(await admin.describe_topics(topics)):
        if asyncio.get_running_loop().time() >= deadline:
            message = f"Kafka topics without a leader or not authorized after {timeout_s:g} s: {', '.join(pending)}"
            if raise_on_timeout:
                raise TimeoutError(message)
            log.warning("%s; consuming them from the next metadata refresh", message)
            return
        await asyncio.sleep(KAFKA_TOPICS_READY_POLL_S)


async def check_topic_limits(settings: Settings, needed_bytes: int = KAFKA_MAX_MESSAGE_BYTES) -> None:
    """Raise :class:`TopicLimitError` naming each existing llmq topic whose effective max.message.bytes on the broker is
    below ``needed_bytes`` (records that large would be refused at run time). Topics not created yet are skipped."""
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        limits = await _topic_limits(admin, [t for t in topic_layout(settings) if t in existing])
    finally:
        await admin.close()
    low = {topic: limit for topic, limit in limits.items() if limit < needed_bytes}
    if low:
        found = ", ".join(f"{topic} has {limit}" for topic, limit in sorted(low.items()))
        raise TopicLimitError(
            f"Kafka topic limit too low: {found} {MAX_MESSAGE_BYTES_CONFIG}; llmq needs at least {needed_bytes} (one"
            f" result or request of the largest allowed size per record). Fix: kafka-configs.sh --alter --entity-type"
            f" topics --entity-name <topic> --add-config {MAX_MESSAGE_BYTES_CONFIG}={needed_bytes} (and the brokers'"
            f" replica.fetch.max.bytes at least as large)"
        )


async def require_topic_limits(settings: Settings) -> None:
    """:func:`check_topic_limits` at a service's start: a topic limit too low ends the process with its message."""
    try:
        await check_topic_limits(settings)
    except TopicLimitError as exc:
        log.error("%s", exc)
        raise SystemExit(f"refusing to start: {exc}") from None


async def _topic_limits(admin: AIOKafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """Effective max.message.bytes of each of ``topics`` (the topic's own setting, else the broker's default)."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, {MAX_MESSAGE_BYTES_CONFIG: None}) for t in topics]
    limits = {}
    for response in await admin.describe_configs(resources):
        for error_code, error_message, _type, name, entries, *_ in response.resources:
            if error_code:
                raise TopicLimitError(f"cannot read the configuration of topic {name}: {error_message} ({error_code})")
            for entry in entries:
                if entry[0] == MAX_MESSAGE_BYTES_CONFIG:
                    limits[name] = int(entry[1])
    return limits

"""The batcher loop: consume requests and signals -> policy.schedule -> produce batches and answers -> commit.

Tasks: Kafka request consumer (GROUP_BATCHER, manual commits), Redis subscriber (heartbeats, cancels), an optional
llmq.results tail (feeds ``policy.on_result``), the pod watch (cancels the work of API pods that are gone), and the
decider, which runs the policy on every event and at its wake-up time. All of them share one asyncio thread, so the
policy needs no locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Literal

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerClosed
from redis.asyncio import Redis

from llmq_batcher import ingress
from llmq_batcher.offsets import OffsetTracker
from llmq_batcher.outcomes import (
    final_result,
    refused,
    replayed,
    reply_topic_refusal,
    reused_id,
    reused_id_other_parameters,
)
from llmq_batcher.pods import PodWatch
from llmq_batcher.policy import CLASS_KEYS, AddStatus, Answer, BatchDispatch, BatchPolicy, Decision
from llmq_batcher.saturation import BacklogDrain, DrainMeter, saturation_report
from llmq_batcher.spans import RequestSpans
from llmq_core import constants, kafka, requests, runtime, tracing, wire
from llmq_core.clock import Clock
from llmq_core.metrics import BatcherMetrics
from llmq_core.models import BUILTIN_MODELS
from llmq_core.names import Names
from llmq_core.settings import IngressGrant
from llmq_core.status import ErrorCode, ErrorType, outcome_label
from llmq_core.telemetry import request_fields

log = logging.getLogger(__name__)

LOAD_STATS_INTERVAL_MS = 1000
IDLE_WAKE_S = 1.0
RESTART_DELAY_S = 1.0
POD_GONE_REASON = "pod_gone"
PRODUCE_RETRY_BASE_MS = 100  # first hold of a model after a transient produce failure; doubles per failure in a row
PRODUCE_RETRY_MAX_MS = 5000
_TOO_LARGE = kafka.RECORD_TOO_LARGE_ERRORS
# Not marked retriable by aiokafka, yet none of them is the record's fault (a broker outage raises the first two; the
# producer replaces itself after the others, see kafka.RenewableProducer).
_TRANSIENT = (KafkaTimeoutError, ProducerClosed, *kafka.BROKEN_PRODUCER_ERRORS)


def is_permanent(exc: BaseException) -> bool:
    """Whether producing the same record again cannot succeed (aiokafka marks it non-retriable)."""
    return isinstance(exc, KafkaError) and not exc.retriable and not isinstance(exc, _TRANSIENT)


def retry_delay_ms(failures: int) -> int:
    """Hold after ``failures`` transient produce failures in a row (>= 1): exponential, capped."""
    return min(PRODUCE_RETRY_BASE_MS << min(failures - 1, 16), PRODUCE_RETRY_MAX_MS)


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
        results: AIOKafkaConsumer | None = None,
        names: Names = Names(),
        metrics: BatcherMetrics | None = None,
        pod_check_ms: int = 1000,
        pod_grace_ms: int = 2000,
        catalogue: frozenset[str] = frozenset(BUILTIN_MODELS),
        rules: requests.Rules = requests.Rules(),
        request_id_ttl_ms: int = 86_400_000,
        ingress_grants: Mapping[str, IngressGrant] = {},
    ) -> None:
        """Every ``pod_check_ms`` the pods of held requests are looked up; one missing for ``pod_grace_ms`` is gone.
        ``catalogue``: the models the saturation report always carries (others only while they have workers).
        ``producer``: a kafka.RenewableProducer in service (one refused record must not break every later send).
        ``rules``: what Kafka-direct requests are checked against; ``request_id_ttl_ms``: how long their ids stay
        claimed (Settings.kafka.request_id_ttl_s); ``ingress_grants``: Kafka-direct producers' ingress topics, also
        consumed, and what each one's records speak for (kafka.ingress_grants)."""
        self.policy = policy
        self.consumer = consumer
        self.producer = producer
        self.redis = redis
        self.results = results
        self.clock = clock
        self.max_queued = max_queued
        self.names = names
        self.metrics = metrics
        self.spans = RequestSpans()  # used only while tracing is on
        self.pod_check_ms = pod_check_ms
        self.pods = PodWatch(pod_grace_ms)
        self.offsets = OffsetTracker()
        self._held: dict[str, list[tuple[TopicPartition, int]]] = {}  # request id -> records not settled yet
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._last_commit_ms = 0
        self._deferred_blocked = False  # whether the last round paused the deferred partitions
        self._last_load_ms = 0
        self._counts: Counter[str] = Counter()  # stats counted since they were last written
        self.catalogue = catalogue
        self.rules = rules
        self.request_id_ttl_ms = request_id_ttl_ms
        self.ingress_grants = dict(ingress_grants)
        self.started_ms = clock.now_ms()
        self.drain = DrainMeter(self.started_ms)
        self.backlog_drain = BacklogDrain(self.started_ms)
        self._produce_failures: Counter[str] = Counter()  # model -> transient batch produce failures in a row
        self._announced: dict[str, tuple[int, int]] = {}  # model a worker heartbeat named -> (context window, when)

    def topics(self) -> list[str]:
        """What it consumes: the request and ingress topics."""
        return [*self.names.request_topics, *self.ingress_grants]

    def subscribe(self) -> None:
        """Join GROUP_BATCHER over :meth:`topics`; revoked partitions are committed and forgotten."""
        self.consumer.subscribe(self.topics(), listener=_Revocations(self))

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        inputs = [self._consume, self._signals, self._watch_pods]
        inputs += [self._tail_results] if self.results is not None else []
        feeders = [asyncio.create_task(self._supervised(read)) for read in inputs]
        try:
            await self._decide()
        finally:
            await runtime.cancel_and_wait(feeders)

    # --- inputs -------------------------------------------------------------------------------------------------------

    async def _supervised(self, read) -> None:
        """Keep an input running across broker or Redis outages: log, back off, start it again."""
        while not self._stopping.is_set():
            try:
                await read()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; restarting in %.1f s", read.__name__, RESTART_DELAY_S)
                await asyncio.sleep(RESTART_DELAY_S)

    async def _consume(self) -> None:
        while not self._stopping.is_set():
            records = await self.consumer.getmany(timeout_ms=100, max_records=500)
            for tp, batch in records.items():
                for i, record in enumerate(batch):
                    try:
                        await self.ingest(tp, record)
                    except Exception:  # only the dead letter's produce can fail here (a broker outage)
                        self._rewind(records, tp, i)
                        raise
            if records:
                self._wake.set()

    def _rewind(self, records, failed_tp: TopicPartition, failed_index: int) -> None:
        """Seek every partition of a fetch back to its first record not taken in, so a failure while taking one record
        in drops none of the records fetched with it: they are fetched again when the consume task restarts."""
        tps = list(records)
        for tp in tps[tps.index(failed_tp) :]:
            first = records[tp][failed_index if tp == failed_tp else 0]
            self.offsets.untrack(tp, first.offset)
            self.consumer.seek(tp, first.offset)

    async def ingest(self, tp: TopicPartition, record) -> None:
        """Take one consumed record: a request goes to the policy, anything else to the dead letters. Whatever goes
        wrong while taking one record in costs only that record (dead-lettered with the reason), never its fetch."""
        self.offsets.track(tp, record.offset)
        try:
            message = await self._admit(tp, record)
            status = self.policy.add(message, self.clock.now_ms()) if message is not None else None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(tp, record, str(exc))
            return
        except Exception as exc:
            log.exception("taking in %s[%d]@%d failed", record.topic, record.partition, record.offset)
            await self._dead_letter(tp, record, f"{type(exc).__name__}: {exc}")
            return
        if status is None:
            return
        if status is AddStatus.DUPLICATE and message.request_id not in self._held:
            self.offsets.settle(tp, record.offset)  # its twin already went out
        else:
            self._held.setdefault(message.request_id, []).append((tp, record.offset))
        if self.metrics is not None:
            self.metrics.consumed(message)
        if tracing.enabled() and status is not AddStatus.DUPLICATE:
            self.spans.consumed(message, record.headers)

    async def _admit(self, tp: TopicPartition, record) -> wire.GenerationRequest | None:
        """The record's request, checked, to be queued; None when it was answered or dead-lettered here."""
        message = wire.decode_record(record.value, record.headers)
        if not isinstance(message, wire.GenerationRequest):
            await self._dead_letter(tp, record, f"not a generation_request: {type(message).__name__}")
            return None
        grant = self.ingress_grants.get(tp.topic)
        if grant is not None and (reason := ingress.reply_refusal(message)) is not None:
            self._count_ingress_refused(ingress.REPLY_NOT_KAFKA)
            await self._dead_letter(tp, record, reason)
            return None
        return await self._enter_direct(tp, record.offset, message, grant)

    async def _enter_direct(
        self, tp: TopicPartition, offset: int, request: wire.GenerationRequest, grant: IngressGrant | None = None
    ) -> wire.GenerationRequest | None:
        """Where a request from Kafka enters, whatever its reply kind (an API pod's records pass too): the API's checks
        (``llmq_core.requests``) and its deadline clamped to its class's maximum (a batch-job line's: the longest
        batch window); a Kafka-direct one's reply topic and its id's claim first. Returns it to be queued, or None when
        it was answered here: errored for a fault, or, for a copy of a known id that is not held here, that id's stored
        result again (errored ``request_id_reused`` when there is none or its parameters differ). A true copy of an id
        held here joins it (one answer, as before). An ingress record (``grant``) claiming another tenant or class
        than its topic's is answered errored before its id is claimed."""
        now_ms = self.clock.now_ms()
        if isinstance(request.reply_to, wire.KafkaReply):
            reason = kafka.reply_topic_error(request.reply_to.topic, self.names.reply_topic_prefixes)
            if reason is not None:  # checked first: nothing, not even a replay, may be produced to that topic
                await self._answer_at_entry(tp, offset, request, refused(request, reply_topic_refusal(reason), now_ms))
                return None
            if grant is not None and (error := ingress.refusal(request, grant)) is not None:
                await self._refuse_ingress(tp, offset, request, grant, error)
                return None
            position = f"{tp.topic}/{tp.partition}@{offset}"
            fingerprint = requests.fingerprint(request)
            earlier = await self._claim(request.request_id, position, fingerprint)
            if earlier is not None:
                return await self._enter_copy(tp, offset, request, position, earlier not in ("", fingerprint))
        try:
            requests.check_request(request, self._rules_now(now_ms))
        except requests.RequestError as exc:
            await self._answer_at_entry(tp, offset, request, refused(request, exc.error_info(), now_ms))
            return None
        max_timeout_ms = self.rules.max_timeout_of(request)
        return request if max_timeout_ms is None else requests.clamp_deadline(request, max_timeout_ms, now_ms)

    async def _refuse_ingress(
        self,
        tp: TopicPartition,
        offset: int,
        request: wire.GenerationRequest,
        grant: IngressGrant,
        error: wire.ErrorInfo,
    ) -> None:
        """Answer an ingress record errored as its producer's own tenant: the tenant it claimed gets nothing."""
        self._count_ingress_refused(error.code or "")
        log.warning("ingress %s refused: %s", tp.topic, error.message, extra=request_fields(request.request_id))
        attributed = msgspec.structs.replace(request, tenant_id=grant.tenant_id)
        await self._answer_at_entry(tp, offset, attributed, refused(attributed, error, self.clock.now_ms()))

    def _count_ingress_refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.ingress_refused.labels(reason).inc()

    def _rules_now(self, now_ms: int) -> requests.Rules:
        """The rules, also accepting the models workers announced lately, as an API pod's catalogue does (its records
        for such a model pass here too)."""
        if self._announced.keys() <= self.rules.windows.keys():  # every request checks: the catalogue's models
            return self.rules
        announced = {
            model: window
            for model, (window, seen_ms) in self._announced.items()
            if now_ms - seen_ms <= constants.SEEN_MODEL_TTL_MS
        }
        if announced.keys() <= self.rules.windows.keys():
            return self.rules
        return dataclasses.replace(self.rules, windows={**announced, **self.rules.windows})

    async def _claim(self, request_id: str, position: str, fingerprint: str) -> str | None:
        """Claim ``request_id`` for the record at ``position`` with the fingerprint of its parameters; None when this
        record is the first (a redelivery of the claiming record is not another), else the first one's fingerprint
        ("" for a claim that carries none). Without Redis every record counts as the first."""
        try:
            first = await self.redis.set(
                constants.request_copy_key(request_id),
                f"{position} {fingerprint}",
                nx=True,
                get=True,
                px=self.request_id_ttl_ms,
            )
        except Exception as exc:
            log.warning("claiming request id failed, taking it as new: %s", exc, extra=request_fields(request_id))
            return None
        first_position, _, first_fingerprint = (first or b"").decode(errors="replace").partition(" ")
        return None if first is None or first_position == position else first_fingerprint

    async def _enter_copy(
        self, tp: TopicPartition, offset: int, request: wire.GenerationRequest, position: str, differs: bool
    ) -> wire.GenerationRequest | None:
        """A record re-producing a claimed request_id: errored when its parameters ``differ`` from the first's (a
        producer's id reuse must not get another request's result), else it joins a twin held here, else the stored
        result again. A twin in flight whose result is stored already has finished (the results tail reads
        llmq.results a fetch wait behind the router): the copy gets that result, not a join that nothing answers."""
        if differs:
            error = reused_id_other_parameters(request.request_id)
            await self._answer_at_entry(tp, offset, request, refused(request, error, self.clock.now_ms(), position))
            return None
        if self.policy.holds(request.request_id):
            if not self.policy.in_flight(request.request_id):
                return request  # joins its queued twin: unchecked, so it cannot answer in the twin's place
            stored = await self._stored_result(request)
            if not isinstance(stored, wire.FinalResult):
                return request  # joins its twin in flight (or Redis cannot tell: the twin's answer is the answer)
            self.policy.on_result(request.request_id, stored.tenant_id)
            await self._answer_copy(tp, offset, request, position, stored)
            return None
        stored = await self._stored_result(request)
        if stored is not False:  # Redis unreadable: left unsettled, answered after a restart
            await self._answer_copy(tp, offset, request, position, stored)
        return None

    async def _stored_result(self, request: wire.GenerationRequest) -> wire.FinalResult | None | Literal[False]:
        """The stored result of ``request``'s id; None when there is none; False when Redis cannot be read."""
        try:
            stored = await self.redis.get(constants.result_key(request.request_id))
        except Exception as exc:
            log.error("reading the stored result failed: %s", exc, extra=request_fields(request.request_id))
            return False
        return _decoded_result(stored)

    async def _answer_copy(
        self,
        tp: TopicPartition,
        offset: int,
        request: wire.GenerationRequest,
        position: str,
        first: wire.FinalResult | None,
    ) -> None:
        """Answer a re-produced id with its stored result ``first``, or errored ``request_id_reused`` when there is
        none to give."""
        result = replayed(first, request, position) if first is not None else None
        if result is None:
            result = refused(request, reused_id(request.request_id), self.clock.now_ms(), position)
        await self._answer_at_entry(tp, offset, request, result)

    async def _answer_at_entry(
        self, tp: TopicPartition, offset: int, request: wire.GenerationRequest, result: wire.FinalResult
    ) -> None:
        """Send ``result`` to llmq.results (the result-router delivers it; an HTTP request's pod also gets it on its
        channel, as every answer), never queueing ``request``. Left unsettled when it cannot be produced, like
        _send_answer: answered again after a restart."""
        await self._publish_replies([result])
        try:
            await kafka.send_message(self.producer, self.names.results_topic, result, key=request.request_id)
        except Exception as exc:
            log.error(
                "answering %s at entry failed: %s", request.request_id, exc, extra=request_fields(request.request_id)
            )
            return
        if self.metrics is not None:
            self.metrics.answered_request(request, result.outcome.value)
        self.offsets.settle(tp, offset)

    async def _signals(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.names.heartbeats_channel, self.names.cancels_channel)
        try:
            while not self._stopping.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                if message is not None:
                    self._on_signal(message["data"])
        finally:
            await pubsub.aclose()

    def _on_signal(self, data: bytes) -> None:
        try:
            message = wire.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring undecodable signal: %s", exc)
            return
        if isinstance(message, wire.WorkerHeartbeat):
            now_ms = self.clock.now_ms()
            self.policy.on_heartbeat(message, now_ms)
            self._announced[message.model] = (message.context_window, now_ms)
        elif isinstance(message, wire.Cancel):
            self.policy.cancel(message.request_id, message.reason)
        else:
            return
        self._wake.set()

    async def _watch_pods(self) -> None:
        """Publish a Cancel for every held request of a gone API pod: queued ones are answered canceled here (our own
        cancels subscription), running ones are aborted by their worker."""
        while not self._stopping.is_set():
            await asyncio.sleep(self.pod_check_ms / 1000)
            held = self.policy.requests_by_pod()
            pods = list(held)
            alive = await self.redis.mget([constants.pod_key(pod) for pod in pods]) if pods else []
            for pod in self.pods.observe({p: v is not None for p, v in zip(pods, alive)}, self.clock.now_ms()):
                log.warning("API pod %s is gone: cancelling its %d requests", pod, len(held[pod]))
                async with self.redis.pipeline(transaction=False) as pipe:
                    for request_id in held[pod]:
                        cancel = wire.Cancel(request_id=request_id, reason=POD_GONE_REASON)
                        pipe.publish(self.names.cancels_channel, wire.encode(cancel))
                    await pipe.execute()

    async def _tail_results(self) -> None:
        while not self._stopping.is_set():
            records = await self.results.getmany(timeout_ms=200, max_records=1000)
            for batch in records.values():
                for record in batch:
                    request_id = record.key.decode(errors="replace") if record.key else ""
                    if self.policy.holds(request_id) and (tenant_id := _result_tenant(record)) is not None:
                        self.policy.on_result(request_id, tenant_id)
            if records:
                self._wake.set()

    # --- decisions and outputs ----------------------------------------------------------------------------------------

    async def _decide(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            decision = await self.step(drain=stopping)
            if stopping:
                return
            await self._sleep_until(decision.next_wake_ms)

    async def step(self, drain: bool = False) -> Decision:
        """One round: schedule, produce batches and answers, pause/resume deferred, commit (always when ``drain``)."""
        decision = self.policy.schedule(self.clock.now_ms(), drain=drain)
        await self._act(decision)
        await self._record_stats(decision, force=drain)
        self._pause_deferred()
        await self._commit(force=drain)
        return decision

    async def _sleep_until(self, wake_ms: int | None) -> None:
        timeout_s = IDLE_WAKE_S if wake_ms is None else min(max(wake_ms - self.clock.now_ms(), 0) / 1000, IDLE_WAKE_S)
        if not self._wake.is_set():  # about one round per fetch under load: no task, no timer when woken already
            try:
                async with asyncio.timeout(timeout_s):  # wait_for would wrap the wait in a task every round
                    await self._wake.wait()
            except TimeoutError:
                pass
        self._wake.clear()

    async def _act(self, decision: Decision) -> None:
        sent = [b for out in await _all(self._send_batch(b) for b in decision.batches) for b in out]
        self._count_sent(sent, decision)
        if decision.answers:
            results = [final_result(answer, self.clock.now_ms()) for answer in decision.answers]
            await self._publish_replies(results)
            await _all(self._send_answer(a, r) for a, r in zip(decision.answers, results))
        for request_id in decision.dropped:
            self._settle(request_id)
            if tracing.enabled():
                self.spans.dropped(request_id)

    async def _send_batch(self, batch: BatchDispatch) -> list[BatchDispatch]:
        """Produce ``batch``; returns the batches that went out (its parts, when the broker refused it as too large)."""
        message, flushes = batch.to_wire(), []
        if tracing.enabled():
            message, flushes = self.spans.flush(message, batch.partition)
        try:
            await kafka.send_message(
                self.producer, self.names.batches_topic, message, key=batch.batch_id, partition=batch.partition
            )
        except Exception as exc:
            return await self._produce_failed(batch, exc)
        finally:
            for span in flushes:
                span.end()
        self._produce_failures.pop(batch.model, None)
        if self.metrics is not None:
            self.metrics.dispatched(
                batch.model,
                batch.flush_reason,
                batch.requests,
                self.clock.now_ms(),
                self.policy.config.model_max_batch.get(batch.model),
            )
        for request in batch.requests:
            self._settle(request.request_id)
        return [batch]

    async def _produce_failed(self, batch: BatchDispatch, exc: Exception) -> list[BatchDispatch]:
        """Never put a refused record back in front: bisect one too large (its parts go out one after the other, a lone
        request that cannot is answered), answer the requests of one refused for good; a transient failure holds the
        model, then retries."""
        extra = {"batch_id": batch.batch_id}
        self._wake.set()  # answers and re-queued requests are for the next round
        if not is_permanent(exc):
            self._produce_failures[batch.model] += 1
            delay_ms = retry_delay_ms(self._produce_failures[batch.model])
            log.error("producing batch failed, re-queueing in %d ms: %r", delay_ms, exc, extra=extra)
            self.policy.undispatch(batch, self.clock.now_ms(), retry_in_ms=delay_ms)
            return []
        if isinstance(exc, _TOO_LARGE) and len(batch.requests) > 1:
            log.warning("batch of %d refused as too large, splitting: %r", len(batch.requests), exc, extra=extra)
            sent = []
            for part in self.policy.split(batch, self.clock.now_ms()):
                sent += await self._send_batch(part)
            return sent
        log.error("batch refused for good, answering its %d requests: %r", len(batch.requests), exc, extra=extra)
        if isinstance(exc, _TOO_LARGE):
            self.policy.fail(
                batch,
                ErrorType.INVALID_REQUEST,
                f"The request does not fit in one record of the batch topic: {exc}",
                ErrorCode.REQUEST_TOO_LARGE,
            )
        else:
            self.policy.fail(
                batch, ErrorType.SERVER, f"The batch topic refused the request: {exc}", ErrorCode.DISPATCH_FAILED
            )
        return []

    async def _publish_replies(self, results: list[wire.FinalResult]) -> None:
        """Answers of HTTP requests to their pods' channels, in one pipeline (many at once must not each take a pooled
        connection). Best effort: every answer also goes to llmq.results, whose stored copy a resubscribing pod reads."""
        replies = [
            (constants.replies_channel(r.reply_to.instance_id), wire.encode(r))
            for r in results
            if isinstance(r.reply_to, wire.HttpReply)
        ]
        if not replies:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for channel, payload in replies:
                    pipe.publish(channel, payload)
                await pipe.execute()
        except Exception as exc:
            log.warning("publishing %d answers failed: %s", len(replies), exc)

    async def _send_answer(self, answer: Answer, result: wire.FinalResult) -> None:
        outcome = outcome_label(answer.outcome, answer.error_type)
        traceparent = self.spans.answered(result.request_id, outcome) if tracing.enabled() else None
        try:
            await kafka.send_message(
                self.producer, self.names.results_topic, result, key=result.request_id, traceparent=traceparent
            )
        except Exception as exc:  # left unsettled: the request is redelivered after a restart and answered again
            log.error(
                "answering %s failed: %s",
                result.outcome.value,
                exc,
                extra=request_fields(result.request_id, traceparent or answer.request.traceparent),
            )
            return
        if self.metrics is not None:
            self.metrics.answered_request(answer.request, outcome)
        self._settle(result.request_id)

    def _settle(self, request_id: str) -> None:
        for tp, offset in self._held.pop(request_id, ()):
            self.offsets.settle(tp, offset)

    async def _dead_letter(self, tp: TopicPartition, record, reason: str) -> None:
        log.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason)
        await kafka.dead_letter(self.producer, record, reason, topic=self.names.dead_letters_topic)
        self.offsets.settle(tp, record.offset)

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

    def _count_sent(self, sent: list[BatchDispatch], decision: Decision) -> None:
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

    async def _record_stats(self, decision: Decision, force: bool = False) -> None:
        """Every LOAD_STATS_INTERVAL_MS (and when ``force``), in one Redis round trip: the counts since the last time,
        the queues' load and the saturation report (once per round, it cost a round trip per dispatched batch)."""
        now_ms = self.clock.now_ms()
        if not force and now_ms - self._last_load_ms < LOAD_STATS_INTERVAL_MS:
            return
        self._last_load_ms = now_ms
        counts, self._counts = self._counts, Counter()
        load = {}
        for key in CLASS_KEYS:
            load[f"queued_{key}"] = decision.load[key].depth
            load[f"oldest_ms_{key}"] = decision.load[key].oldest_age_ms
        models = self.policy.model_states(now_ms)
        if self.metrics is not None:
            self.metrics.queues(
                (key, name, c.depth, c.oldest_age_ms)
                for name, state in models.items()
                for key, c in state.classes.items()
            )
        report = saturation_report(
            self.policy.config.batch_id_prefix,
            self.started_ms,
            now_ms,
            decision.load,
            models,
            self.catalogue,
            self.drain.rates(now_ms),
            self.backlog_drain.rates(now_ms, models),
        )
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name, value in counts.items():
                    pipe.hincrby(self.names.stats_key, name, value)
                pipe.hset(self.names.stats_key, mapping=load)
                pipe.hset(self.names.saturation_key, report.batcher_id, wire.encode(report))
                await pipe.execute()
        except Exception as exc:  # stats are best effort
            log.warning("stats update failed: %s", exc)

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


async def _all(coroutines) -> list:
    """Await ``coroutines`` together, as ``asyncio.gather``; one alone is awaited in place (most rounds send one batch
    and answer nothing: gather would wrap it in a task)."""
    coroutines = list(coroutines)
    if len(coroutines) == 1:
        return [await coroutines[0]]
    return await asyncio.gather(*coroutines) if coroutines else []


class _ResultTenant(msgspec.Struct):
    """What the results tail reads of a FinalResult: its tenant (the rest, up to a MiB of text, is skipped)."""

    tenant_id: str


_TENANT_MSGPACK = msgspec.msgpack.Decoder(_ResultTenant)
_TENANT_JSON = msgspec.json.Decoder(_ResultTenant)


def _result_tenant(record) -> str | None:
    """The tenant a record of llmq.results names (read as ``wire.decode`` reads it); None when it names none: such a
    record settles nothing."""
    try:
        value = record.value or b""
        decoder = _TENANT_JSON if wire.is_json(value, wire.content_type_of(record.headers)) else _TENANT_MSGPACK
        return decoder.decode(value).tenant_id
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def _decoded_result(value: bytes | None) -> wire.FinalResult | None:
    """A stored result (msgpack FinalResult), or None when there is none or it cannot be read."""
    try:
        message = wire.decode(value) if value is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return message if isinstance(message, wire.FinalResult) else None


class _Revocations(ConsumerRebalanceListener):
    def __init__(self, loop: BatcherLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked) -> None:
        await self.loop.commit_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        pass

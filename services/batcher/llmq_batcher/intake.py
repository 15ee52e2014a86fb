"""The batcher's request input: consume records, decide each one's entry (:mod:`llmq_batcher.entry_plan`, pure) around
the Redis reads it needs, and carry the plan out: queue it in the policy, answer it at entry, or dead-letter it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from llmq_batcher.dispatch import publish_replies
from llmq_batcher.entry_plan import (
    Announced,
    Claim,
    DeadLetter,
    EntryPlan,
    Join,
    Queue,
    ReadStored,
    Refuse,
    Replay,
    Twin,
    Unreadable,
    claim_answer,
    decoded_result,
    plan_arrival,
    plan_claimed,
    plan_stored,
    position_of,
    rules_now,
)
from llmq_batcher.outcomes import refused, reply_topic_refusal
from llmq_batcher.policy import AddStatus
from llmq_batcher.shared import Shared
from llmq_core import constants, kafka, requests, tracing, wire
from llmq_core.settings import IngressGrant, RouterSettings, Settings
from llmq_core.telemetry import request_fields
from llmq_core.topics import Presence, TopicView

log = logging.getLogger(__name__)

ROUTER_REFRESH_MS = RouterSettings.model_fields["topic_refresh_ms"].default  # the setting's default
TopicLister = Callable[[], Awaitable[Iterable[str]]]


@dataclass(frozen=True)
class EntryRules:
    """``rules``: what records that did not pass an API pod are checked against; ``request_id_ttl_ms``: how long
    Kafka-direct ids stay claimed (Settings.kafka.request_id_ttl_s); ``ingress_grants``: Kafka-direct producers'
    ingress topics, also consumed, and what each one's records speak for (kafka.ingress_grants)."""

    rules: requests.Rules = requests.Rules()
    request_id_ttl_ms: int = 86_400_000
    ingress_grants: Mapping[str, IngressGrant] = field(default_factory=dict)
    reply_topic_refresh_ms: int = ROUTER_REFRESH_MS  # at most one listing of the cluster's topics per this

    @classmethod
    def from_settings(cls, settings: Settings) -> EntryRules:
        return cls(
            requests.Rules.from_settings(settings),
            settings.kafka.request_id_ttl_s * 1000,
            kafka.ingress_grants(settings),
            settings.router.topic_refresh_ms,
        )


class Intake:
    """Takes records of the request and ingress topics in. ``announced``: models workers' heartbeats named lately
    (:class:`llmq_batcher.signals.Signals` keeps it), accepted as an API pod's catalogue accepts them."""

    def __init__(
        self,
        shared: Shared,
        consumer: AIOKafkaConsumer,
        entry: EntryRules,
        announced: Announced,
        list_topics: TopicLister | None = None,
    ) -> None:
        """``list_topics``: lists the cluster's topics, for the entry check of a Kafka-direct request's reply topic
        (None: no such check; the result-router still dead-letters a reply to a missing topic)."""
        self.shared = shared
        self.consumer = consumer
        self.entry = entry
        self.announced = announced
        self.list_topics = list_topics
        self.reply_topics = TopicView(shared.clock, entry.reply_topic_refresh_ms)

    def topics(self) -> list[str]:
        """What it consumes: the request and ingress topics."""
        return [*self.shared.names.request_topics, *self.entry.ingress_grants]

    async def consume(self) -> None:
        """Until stopping: fetch records, take each in, wake the decider."""
        while not self.shared.stopping.is_set():
            records = await self.consumer.getmany(timeout_ms=100, max_records=500)
            for tp, batch in records.items():
                for i, record in enumerate(batch):
                    try:
                        await self.ingest(tp, record)
                    except Exception:  # only the dead letter's produce can fail here (a broker outage)
                        self._rewind(records, tp, i)
                        raise
            if records:
                self.shared.wake.set()

    def _rewind(self, records, failed_tp: TopicPartition, failed_index: int) -> None:
        """Seek every partition of a fetch back to its first record not taken in, so a failure while taking one record
        in drops none of the records fetched with it: they are fetched again when the consume task restarts."""
        tps = list(records)
        for tp in tps[tps.index(failed_tp) :]:
            first = records[tp][failed_index if tp == failed_tp else 0]
            self.shared.offsets.untrack(tp, first.offset)
            self.consumer.seek(tp, first.offset)

    async def ingest(self, tp: TopicPartition, record) -> None:
        """Take one consumed record: a request goes to the policy, anything else to the dead letters. Whatever goes
        wrong while taking one record in costs only that record (dead-lettered with the reason), never its fetch."""
        shared = self.shared
        shared.offsets.track(tp, record.offset)
        try:
            message = await self._admit(tp, record)
            status = shared.policy.add(message, shared.clock.now_ms()) if message is not None else None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self.dead_letter(tp, record, str(exc))
            return
        except Exception as exc:
            log.exception("taking in %s[%d]@%d failed", record.topic, record.partition, record.offset)
            await self.dead_letter(tp, record, f"{type(exc).__name__}: {exc}")
            return
        if status is None:
            return
        if status is AddStatus.DUPLICATE and message.request_id not in shared.held:
            shared.offsets.settle(tp, record.offset)  # its twin already went out
        else:
            shared.held.hold(message.request_id, tp, record.offset)
        if shared.metrics is not None:
            shared.metrics.consumed(message)
        if tracing.enabled() and status is not AddStatus.DUPLICATE:
            shared.spans.consumed(message, record.headers)

    async def _admit(self, tp: TopicPartition, record) -> wire.GenerationRequest | None:
        """The record's request to be queued; None when it was answered or dead-lettered here (or waits for a
        restart)."""
        now_ms = self.shared.clock.now_ms()
        message = wire.decode_record(record.value, record.headers)
        position = position_of(tp.topic, tp.partition, record.offset)
        rules = rules_now(self.entry.rules, self.announced, now_ms)
        grant = self.entry.ingress_grants.get(tp.topic)
        plan = plan_arrival(message, grant, position, self.shared.names.reply_topic_prefixes, rules, now_ms)
        if isinstance(plan, Claim) and await self._reply_topic_missing(plan.request.reply_to.topic, record):
            missing = self.reply_topics.missing(plan.request.reply_to.topic)
            plan = Refuse(plan.request, reply_topic_refusal(missing.reason))
        if isinstance(plan, Claim):
            request = plan.request
            earlier = await self._claim(request.request_id, plan)
            plan = plan_claimed(request, plan, earlier, self._twin(request.request_id), rules, now_ms)
            if isinstance(plan, ReadStored):
                plan = plan_stored(request, position, plan.twin, await self._stored_result(request.request_id))
        return await self._carry_out(tp, record, plan)

    async def _carry_out(self, tp: TopicPartition, record, plan: EntryPlan) -> wire.GenerationRequest | None:
        if isinstance(plan, Queue | Join):
            return plan.request
        if isinstance(plan, DeadLetter | Refuse) and plan.ingress_reason is not None:
            self._count_ingress_refused(plan.ingress_reason)
        if isinstance(plan, DeadLetter):
            await self.dead_letter(tp, record, plan.reason)
        elif isinstance(plan, Replay | Refuse):
            if plan.twin_tenant is not None:  # the stored result shows the twin in flight finished
                self.shared.policy.on_result(plan.request.request_id, plan.twin_tenant)
            if isinstance(plan, Refuse):
                await self._refuse(tp, record.offset, plan)
            else:
                await self._answer_at_entry(tp, record.offset, plan.request, plan.result)
        return None  # and a Postpone stays unsettled

    async def _refuse(self, tp: TopicPartition, offset: int, plan: Refuse) -> None:
        request = plan.request
        if plan.ingress_reason is not None:
            log.warning(
                "ingress %s refused: %s", tp.topic, plan.error.message, extra=request_fields(request.request_id)
            )
        result = refused(request, plan.error, self.shared.clock.now_ms(), plan.request_copy)
        await self._answer_at_entry(tp, offset, request, result)

    async def _reply_topic_missing(self, topic: str, record) -> bool:
        """Whether a listing of the cluster's topics asked for after the request was produced (its ``record``'s
        timestamp: its reply topic must exist by then) lacks ``topic``, so nothing is computed for a reply
        nobody can read. A topic not listed yet gets a listing when one is due (at most one per refresh interval);
        a record never waits for one, and a listing that fails lets the record through: the result-router checks
        the topic again when the result is there."""
        if self.list_topics is None:
            return False
        view, produced_ms = self.reply_topics, record.timestamp
        if view.presence(topic, produced_ms) is Presence.UNKNOWN and view.wait_ms() == 0:
            listed_ms = self.shared.clock.now_ms()
            try:
                view.update(await self.list_topics(), listed_ms)
            except Exception as exc:
                log.warning("listing the cluster's topics failed: %r", exc)
                return False
        return view.presence(topic, produced_ms) is Presence.MISSING

    def _twin(self, request_id: str) -> Twin:
        policy = self.shared.policy
        if not policy.holds(request_id):
            return Twin.NONE
        return Twin.IN_FLIGHT if policy.in_flight(request_id) else Twin.QUEUED

    def _count_ingress_refused(self, reason: str) -> None:
        if self.shared.metrics is not None:
            self.shared.metrics.ingress_refused.labels(reason).inc()

    async def _claim(self, request_id: str, claim: Claim) -> str | None:
        """Claim ``request_id`` (SET NX GET): :func:`~llmq_batcher.entry_plan.claim_answer` of what was there. Without
        Redis every record counts as the first."""
        try:
            first = await self.shared.redis.set(
                constants.request_copy_key(request_id),
                f"{claim.position} {claim.fingerprint}",
                nx=True,
                get=True,
                px=self.entry.request_id_ttl_ms,
            )
        except Exception as exc:
            log.warning("claiming request id failed, taking it as new: %s", exc, extra=request_fields(request_id))
            return None
        return claim_answer(first, claim.position)

    async def _stored_result(self, request_id: str) -> wire.FinalResult | None | Unreadable:
        """The stored result of ``request_id``; None when there is none; False when Redis cannot be read."""
        try:
            stored = await self.shared.redis.get(constants.result_key(request_id))
        except Exception as exc:
            log.error("reading the stored result failed: %s", exc, extra=request_fields(request_id))
            return False
        return decoded_result(stored)

    async def _answer_at_entry(
        self, tp: TopicPartition, offset: int, request: wire.GenerationRequest, result: wire.FinalResult
    ) -> None:
        """Send ``result`` to llmq.results (the result-router delivers it; an HTTP request's pod also gets it on its
        channel, as every answer), never queueing ``request``. Left unsettled when it cannot be produced, as a
        dispatched answer: answered again after a restart."""
        shared = self.shared
        await publish_replies(shared.redis, [result])
        try:
            await kafka.send_message(shared.producer, shared.names.results_topic, result, key=request.request_id)
        except Exception as exc:
            log.error(
                "answering %s at entry failed: %s", request.request_id, exc, extra=request_fields(request.request_id)
            )
            return
        if shared.metrics is not None:
            shared.metrics.answered_request(request, result.outcome.value)
        shared.offsets.settle(tp, offset)

    async def dead_letter(self, tp: TopicPartition, record, reason: str) -> None:
        """Produce ``record`` to the dead letters with ``reason`` and settle it; raises when that produce fails."""
        log.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason)
        await kafka.dead_letter(self.shared.producer, record, reason, topic=self.shared.names.dead_letters_topic)
        self.shared.offsets.settle(tp, record.offset)

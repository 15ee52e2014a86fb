"""Where a consumed record enters the batcher: a pure decision returning a plan, shaped like the result-router's
``plan_delivery``. No I/O here (no Redis, no Kafka client): :class:`llmq_batcher.intake.Intake` makes the two Redis
reads a decision may need and carries the plan out.

A record is decided in up to three stages, each a pure function of what is known by then:

1. :func:`plan_arrival` (the decoded record): dead-letter what is not a request or, on an ingress topic, does not reply
   to a Kafka topic. A Kafka-direct request runs under its tenant-scoped id (:func:`scoped`: an ingress record's
   tenant is its topic's); then a Kafka reply's topic rule (checked first: nothing, not even a replay, may be produced
   to a refused topic; an ingress record may name only its producer's reply topics), then the ingress grant (a record
   claiming another tenant or class than its topic's is refused, attributed to the topic's own tenant, before its id
   is claimed); a Kafka-direct id then needs its :class:`Claim`.
   Any other reply kind (an API pod's or a batch job's record) goes straight to the checks.
2. :func:`plan_claimed` (the claim's answer): the first record of an id goes to the checks; a copy whose parameters
   differ is refused; a copy whose twin is queued here joins it; any other copy needs the id's stored result
   (:class:`ReadStored`).
3. :func:`plan_stored` (the stored result): a twin in flight whose result is stored has finished (the results tail
   reads llmq.results a fetch wait behind the router), so the copy gets that result; one with nothing stored joins its
   twin. A copy of an id not held here gets the stored result again (errored ``request_id_reused`` when there is none or
   it is not this tenant's Kafka answer), or waits for a restart when Redis could not be read.

The checks (:func:`plan_checked`) are the API's (``llmq_core.requests``), then the deadline clamped to the class's
maximum (a batch-job line's: the longest batch window).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Literal

import msgspec

from llmq_batcher import ingress
from llmq_batcher.outcomes import replayed, reply_topic_refusal, reused_id, reused_id_other_parameters
from llmq_core import constants, ids, kafka, requests, wire
from llmq_core.settings import IngressGrant
from llmq_core.status import ErrorCode

Announced = Mapping[str, tuple[int, int]]  # model a worker heartbeat named -> (its context window, when: epoch ms)
Unreadable = Literal[False]  # the stored result could not be read (Redis down)


class Twin(enum.Enum):
    """What this batcher holds of a copy's request_id."""

    NONE = "none"
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"


class Queue(msgspec.Struct, frozen=True):
    """Queue ``request``: checked, its deadline clamped."""

    request: wire.GenerationRequest


class Join(msgspec.Struct, frozen=True):
    """``request`` is a true copy of an id held here: it joins its twin (one answer for both), unchecked."""

    request: wire.GenerationRequest


class Replay(msgspec.Struct, frozen=True):
    """Answer the copy ``request`` with ``result``, its id's stored result re-addressed to it. ``twin_tenant``: the
    tenant of a twin held in flight that the stored result shows finished (the policy ends it); None: no such twin."""

    request: wire.GenerationRequest
    result: wire.FinalResult
    twin_tenant: str | None = None


class Refuse(msgspec.Struct, frozen=True):
    """Answer ``request`` errored with ``error`` (``request_copy``: the copy's position, "" for none), never queueing
    it. ``request`` is whom the answer is attributed to (an ingress record's: its topic's own tenant).
    ``ingress_reason``: the ``llmq_batcher_ingress_refused`` reason it counts as (None: not an ingress refusal);
    ``twin_tenant``: as :class:`Replay`'s."""

    request: wire.GenerationRequest
    error: wire.ErrorInfo
    request_copy: str = ""
    ingress_reason: str | None = None
    twin_tenant: str | None = None


class DeadLetter(msgspec.Struct, frozen=True):
    """Send the record to the dead letters with ``reason``; ``ingress_reason`` as :class:`Refuse`'s."""

    reason: str
    ingress_reason: str | None = None


class Postpone(msgspec.Struct, frozen=True):
    """Neither queue nor answer now: the stored result could not be read, so the record stays unsettled and is
    answered after a restart."""


EntryPlan = Queue | Join | Replay | Refuse | DeadLetter | Postpone


class Claim(msgspec.Struct, frozen=True):
    """Next: claim the id of ``request`` (the record's request under its tenant-scoped id) for the record at
    ``position`` with its parameters' ``fingerprint``, then :func:`plan_claimed` with ``request``."""

    request: wire.GenerationRequest
    position: str
    fingerprint: str


class ReadStored(msgspec.Struct, frozen=True):
    """Next: read the id's stored result, then :func:`plan_stored` with ``twin``."""

    twin: Twin


def position_of(topic: str, partition: int, offset: int) -> str:
    """A record's position, as a claim and a copy's ``request_copy`` name it: ``topic/partition@offset``."""
    return f"{topic}/{partition}@{offset}"


def plan_arrival(
    message: wire.Message,
    grant: IngressGrant | None,
    position: str,
    reply_prefixes: tuple[str, ...],
    rules: requests.Rules,
    now_ms: int,
) -> EntryPlan | Claim:
    """Stage 1: the decoded record ``message`` at ``position``, consumed from an ingress topic of ``grant`` (None: a
    request topic). ``reply_prefixes``: Settings.kafka.reply_topic_prefixes; ``rules``: as :func:`plan_checked`'s.
    Raises what the checks raise beyond ``requests.RequestError`` (the record is then dead-lettered)."""
    if not isinstance(message, wire.GenerationRequest):
        return DeadLetter(f"not a generation_request: {type(message).__name__}")
    if grant is not None and (reason := ingress.reply_refusal(message)) is not None:
        return DeadLetter(reason, ingress_reason=ingress.REPLY_NOT_KAFKA)
    if not isinstance(message.reply_to, wire.KafkaReply):
        return plan_checked(message, rules, now_ms)
    attributed = message if grant is None else msgspec.structs.replace(message, tenant_id=grant.tenant_id)
    try:  # the claimed tenant gets nothing: not even an id of its own taken
        request = scoped(attributed)
    except ValueError as exc:
        return DeadLetter(str(exc))
    topic = request.reply_to.topic
    if (reason := kafka.reply_topic_error(topic, reply_prefixes)) is not None:
        return Refuse(request, reply_topic_refusal(reason))
    if grant is not None and (reason := ingress.reply_topic_refusal(topic, grant)) is not None:
        return Refuse(request, reply_topic_refusal(reason), ingress_reason=ErrorCode.INVALID_REPLY_TOPIC.value)
    if grant is not None and (error := ingress.refusal(message, grant)) is not None:
        return Refuse(request, error, ingress_reason=error.code or "")
    return Claim(request, position, requests.fingerprint(request))


def scoped(request: wire.GenerationRequest) -> wire.GenerationRequest:
    """A Kafka-direct ``request`` under its tenant-scoped id (ids.tenant_scoped_id): ids of different tenants never
    collide. ValueError for a tenant id that cannot scope one."""
    return msgspec.structs.replace(request, request_id=ids.tenant_scoped_id(request.tenant_id, request.request_id))


def plan_claimed(
    request: wire.GenerationRequest,
    claim: Claim,
    earlier: str | None,
    twin: Twin,
    rules: requests.Rules,
    now_ms: int,
) -> EntryPlan | ReadStored:
    """Stage 2: ``earlier`` is what claiming the id answered: None when this record is the first (or a redelivery of
    it), else the first record's fingerprint ("" for a claim that carries none). ``twin``: what is held here of the
    id."""
    if earlier is None:
        return plan_checked(request, rules, now_ms)
    if earlier not in ("", claim.fingerprint):  # a producer's id reuse must not get another request's result
        return Refuse(request, reused_id_other_parameters(ids.producer_request_id(request.request_id)), claim.position)
    if twin is Twin.QUEUED:
        return Join(request)  # unchecked, so it cannot answer in the twin's place
    return ReadStored(twin)


def plan_stored(
    request: wire.GenerationRequest, position: str, twin: Twin, stored: wire.FinalResult | None | Unreadable
) -> EntryPlan:
    """Stage 3: ``stored`` is the id's stored result (None: none; False: Redis could not be read); ``twin`` is
    :attr:`Twin.IN_FLIGHT` or :attr:`Twin.NONE`."""
    if twin is Twin.IN_FLIGHT:
        if stored is None or stored is False:
            return Join(request)  # its twin's answer is the answer (or Redis cannot tell: the same)
        return _answer_copy(request, position, stored, stored.tenant_id)
    if stored is False:
        return Postpone()
    return _answer_copy(request, position, stored, None)


def _answer_copy(
    request: wire.GenerationRequest, position: str, stored: wire.FinalResult | None, twin_tenant: str | None
) -> Replay | Refuse:
    """The stored result ``stored`` again, or errored ``request_id_reused`` when there is none to give."""
    result = replayed(stored, request, position) if stored is not None else None
    if result is None:
        return Refuse(
            request, reused_id(ids.producer_request_id(request.request_id)), position, twin_tenant=twin_tenant
        )
    return Replay(request, result, twin_tenant)


def plan_checked(request: wire.GenerationRequest, rules: requests.Rules, now_ms: int) -> Queue | Refuse:
    """The API's checks of ``request`` against ``rules`` (:func:`rules_now`'s), then its deadline clamped to its class's
    maximum as of ``now_ms``."""
    try:
        requests.check_request(request, rules)
    except requests.RequestError as exc:
        return Refuse(request, exc.error_info())
    max_timeout_ms = rules.max_timeout_of(request)
    return Queue(request if max_timeout_ms is None else requests.clamp_deadline(request, max_timeout_ms, now_ms))


def rules_now(rules: requests.Rules, announced: Announced, now_ms: int) -> requests.Rules:
    """``rules``, also accepting the models workers ``announced`` within SEEN_MODEL_TTL_MS of ``now_ms``, as an API
    pod's catalogue does (its records for such a model pass here too); the catalogue's own windows win."""
    if announced.keys() <= rules.windows.keys():  # every request checks: the catalogue's models
        return rules
    fresh = {
        model: window
        for model, (window, seen_ms) in announced.items()
        if now_ms - seen_ms <= constants.SEEN_MODEL_TTL_MS
    }
    if fresh.keys() <= rules.windows.keys():
        return rules
    return dataclasses.replace(rules, windows={**fresh, **rules.windows})


def decoded_result(value: bytes | None) -> wire.FinalResult | None:
    """A stored result (msgpack FinalResult), or None when there is none or it cannot be read."""
    try:
        message = wire.decode(value) if value is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return message if isinstance(message, wire.FinalResult) else None


def claim_answer(first: bytes | None, position: str) -> str | None:
    """What claiming an id (SET NX GET of ``position fingerprint``) answered, read for :func:`plan_claimed`: None when
    this record at ``position`` is the first (nothing was there, or its own earlier claim: a redelivery is not another
    record), else the first record's fingerprint ("" for a claim that carries none)."""
    first_position, _, first_fingerprint = (first or b"").decode(errors="replace").partition(" ")
    return None if first is None or first_position == position else first_fingerprint

"""Kafka-direct producers' ingress topics: who a record speaks for is decided by the topic it arrived on, never by
the record.

Kafka does not tell a consumer who produced a record, but its ACLs decide who may write a topic: each Kafka-direct
producer writes only its own ``constants.ingress_topic(principal)``, which Settings.kafka.ingress maps to one tenant
, the classes it may use and the reply topics it may name. A record there naming no tenant runs as the granted one;
one claiming another tenant or class, or naming a reply topic outside its prefixes, is answered errored (attributed to
the producer's own tenant, so nothing lands in the claimed tenant's results or topics); one asking for a reply that is
not a Kafka topic is dead-lettered: HTTP pods and batch jobs hold only what llmq itself produced.
"""

from __future__ import annotations

from llmq_core import wire
from llmq_core.requests import echo
from llmq_core.settings import IngressGrant
from llmq_core.status import ErrorCode, ErrorType

REPLY_NOT_KAFKA = "reply_not_kafka"  # metric reason of an ingress record dead-lettered for its reply kind


def reply_topic_refusal(topic: str, grant: IngressGrant) -> str | None:
    """Why the producer ``grant`` describes may not have results produced to ``topic`` (None: it may): only its own
    reply topics, so no producer writes into another tenant's topic."""
    if topic.startswith(grant.reply_topic_prefixes):
        return None
    return (
        f"reply_to.topic {echo(topic)} is not one of this producer's reply topics (prefixes: "
        f"{', '.join(grant.reply_topic_prefixes)})"
    )


def refusal(request: wire.GenerationRequest, grant: IngressGrant) -> wire.ErrorInfo | None:
    """Why the ingress record ``request`` may not run for the producer ``grant`` describes; None when it may."""
    if request.tenant_id not in (grant.tenant_id, wire.DEFAULT_TENANT_ID):  # naming none: the grant's
        return _not_allowed(
            ErrorCode.TENANT_NOT_ALLOWED,
            "tenant_id",
            f"This ingress topic speaks for tenant {grant.tenant_id!r} only; the record claimed "
            f"{echo(request.tenant_id)}. Set tenant_id to {grant.tenant_id!r}.",
        )
    if request.traffic_class not in grant.classes:
        return _not_allowed(
            ErrorCode.CLASS_NOT_ALLOWED,
            "traffic_class",
            f"This ingress topic may not use the {request.traffic_class} class (allowed: {', '.join(grant.classes)}).",
        )
    return None


def _not_allowed(code: ErrorCode, param: str, message: str) -> wire.ErrorInfo:
    """A permission error: the ingress topic's grant does not cover the record's ``param``."""
    return wire.ErrorInfo(type=ErrorType.PERMISSION, code=code, param=param, message=message)


def reply_refusal(request: wire.GenerationRequest) -> str | None:
    """Why the ingress record ``request`` cannot be answered at all (its dead letter's reason); None when it can."""
    if isinstance(request.reply_to, wire.KafkaReply):
        return None
    return f"an ingress record must reply to a Kafka topic, not {type(request.reply_to).__name__}"

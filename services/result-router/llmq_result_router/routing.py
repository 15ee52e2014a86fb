"""What the result-router does with one FinalResult: a pure decision, so the loop stays consume -> decide -> produce."""

from __future__ import annotations

import msgspec

from llmq_core import wire
from llmq_core.kafka import is_valid_topic_name


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Actions for one result: store it under its request_id, and produce it to ``reply_topic`` (None: no Kafka reply).
    ``undeliverable`` says why a Kafka reply cannot be produced at all (the result then goes to the dead letters)."""

    request_id: str
    tenant_id: str = ""  # whose stored results ``store`` counts against
    store: bytes
    reply_topic: str | None = None
    reply_value: bytes | None = None
    reply_content_type: str | None = None
    undeliverable: str | None = None


def plan_delivery(result: wire.FinalResult) -> Delivery:
    """Every result is stored (msgpack); a KafkaReply result is also encoded for its topic in the producer's format,
    unless its topic is no legal Kafka topic name (``undeliverable``)."""
    stored = wire.encode(result)
    reply = result.reply_to
    if isinstance(reply, wire.KafkaReply) and not is_valid_topic_name(reply.topic):
        # Producing would fail on every redelivery and hold up every result behind this one.
        return Delivery(request_id=result.request_id, tenant_id=result.tenant_id, store=stored,
                        undeliverable=f"reply_to.topic {reply.topic!r} is not a valid Kafka topic name")
    if isinstance(reply, wire.KafkaReply):
        return Delivery(
            request_id=result.request_id,
            tenant_id=result.tenant_id,
            store=stored,
            reply_topic=reply.topic,
            reply_value=wire.encode(result, reply.content_type),
            reply_content_type=reply.content_type,
        )
    return Delivery(request_id=result.request_id, tenant_id=result.tenant_id, store=stored)

"""What the result-router does with one FinalResult: a pure decision, so the loop stays consume -> decide -> produce."""

from __future__ import annotations

import msgspec

from llmq_core import wire


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Actions for one result: store it under its request_id, and produce it to ``reply_topic`` (None: no Kafka reply)."""

    request_id: str
    store: bytes
    reply_topic: str | None = None
    reply_value: bytes | None = None
    reply_content_type: str | None = None


def plan_delivery(result: wire.FinalResult) -> Delivery:
    """Every result is stored (msgpack); a KafkaReply result is also encoded for its topic in the producer's format."""
    stored = wire.encode(result)
    reply = result.reply_to
    if isinstance(reply, wire.KafkaReply):
        return Delivery(
            request_id=result.request_id,
            store=stored,
            reply_topic=reply.topic,
            reply_value=wire.encode(result, reply.content_type),
            reply_content_type=reply.content_type,
        )
    return Delivery(request_id=result.request_id, store=stored)

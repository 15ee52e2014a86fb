"""What the result-router does with one FinalResult: a pure decision, so the loop stays consume -> decide -> produce."""

from __future__ import annotations

import msgspec

from llmq_core import constants, ids, wire
from llmq_core.kafka import reply_topic_error
from llmq_core.status import ErrorCode
from llmq_jobs import lines


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Actions for one result: store it under its request_id, and produce it to ``reply_topic`` (None: no Kafka reply).
    ``undeliverable`` says why nothing may be produced to ``reply_topic`` (the result then goes to the dead letters)."""

    request_id: str
    tenant_id: str = ""  # whose stored results ``store`` counts against
    store: bytes | None  # None: nothing to store (the answer to a re-produced copy: the first result stays)
    delivered_key: str = ""  # Redis marker of this reply's delivery (constants.delivered_key / copy_delivered_key)
    reply_topic: str | None = None
    reply_key: bytes | None = None  # the producer's own request_id (ids.producer_request_id): it knows no other
    reply_value: bytes | None = None
    reply_content_type: str | None = None
    undeliverable: str | None = None


def plan_delivery(result: wire.FinalResult, allowed_prefixes: tuple[str, ...] = ()) -> Delivery:
    """Every result is stored (msgpack) but the answer to a re-produced copy; a KafkaReply result is also encoded for
    its topic in the producer's format, under the producer's own request_id, unless results may not go to that topic
    (``undeliverable``: see :func:`reply_topic_error`, ``allowed_prefixes`` being Settings.kafka.reply_topic_prefixes;
    or the batcher refused the request for its topic, ``invalid_reply_topic``)."""
    stored = None if result.request_copy else wire.encode(result)
    reply = result.reply_to
    if not isinstance(reply, wire.KafkaReply):
        return Delivery(request_id=result.request_id, tenant_id=result.tenant_id, store=stored)
    producer_id = ids.producer_request_id(result.request_id)
    answer = {  # what the producer reads, in its format: also what is dead-lettered when it cannot be sent
        "reply_topic": reply.topic,
        "reply_key": producer_id.encode(),
        "reply_value": _reply_value(msgspec.structs.replace(result, request_id=producer_id), reply),
        "reply_content_type": reply.content_type,
    }
    refused = _reply_refusal(result, allowed_prefixes)
    if refused is not None:
        # An illegal name would fail on every redelivery; llmq's own or Kafka's internal topics must never get results.
        return Delivery(
            request_id=result.request_id, tenant_id=result.tenant_id, store=stored, undeliverable=refused, **answer
        )
    return Delivery(
        request_id=result.request_id,
        tenant_id=result.tenant_id,
        store=stored,
        delivered_key=(
            constants.copy_delivered_key(result.request_id, result.request_copy)
            if result.request_copy
            else constants.delivered_key(result.request_id)
        ),
        **answer,
    )


def _reply_value(result: wire.FinalResult, reply: wire.KafkaReply) -> bytes:
    """The reply record's value in ``reply.content_type``: the FinalResult, or its API result line (``body`` api)."""
    return wire.encode(
        lines.reply_line(result) if reply.body == constants.REPLY_BODY_API else result, reply.content_type
    )


def _reply_refusal(result: wire.FinalResult, allowed_prefixes: tuple[str, ...]) -> str | None:
    """Why ``result`` may not be produced to its Kafka reply topic; None when it may."""
    if result.error is not None and result.error.code == ErrorCode.INVALID_REPLY_TOPIC:
        return result.error.message  # a producer's refusal for the topic it named is never written there
    return reply_topic_error(result.reply_to.topic, allowed_prefixes)

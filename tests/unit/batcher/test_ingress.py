"""Kafka-direct producers' ingress topics (issue 16, item 2): a record speaks for the tenant its topic is granted to,
whatever it claims; a claim of another tenant or class is answered errored as the producer's own tenant and counted,
one asking for an HTTP or batch-job reply is dead-lettered."""

from __future__ import annotations

import msgspec
from aiokafka import TopicPartition

from llmq_batcher.intake import EntryRules
from llmq_core import constants, kafka, wire
from llmq_core.metrics import BatcherMetrics
from llmq_core.settings import IngressGrant, Settings
from llmq_core.status import ErrorCode
from tests.fakes import Record
from tests.unit.batcher.helpers import NAMES, req
from tests.unit.batcher.helpers import make_loop as make_batcher

TOPIC = constants.ingress_topic("acme-svc")
PARTITION = TopicPartition(TOPIC, 0)
GRANTS = {TOPIC: IngressGrant(tenant_id="acme", classes=("interactive", "deferred"), reply_topic_prefixes=("acme.",))}
REPLIES = wire.KafkaReply(topic="acme.replies")


def make_loop():
    metrics = BatcherMetrics()
    loop, _, producer, _ = make_batcher(entry=EntryRules(ingress_grants=GRANTS), metrics=metrics)
    return loop, producer, metrics


async def put(loop, request: wire.GenerationRequest, offset: int = 0) -> None:
    value = wire.encode(request)
    await loop.ingest(PARTITION, Record(offset=offset, value=value, key=request.request_id.encode(), topic=TOPIC))


def record(request_id: str = "r1", **fields) -> wire.GenerationRequest:
    return msgspec.structs.replace(req(request_id), **{"reply_to": REPLIES, "tenant_id": "acme", **fields})


def refused(metrics: BatcherMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("llmq_batcher_ingress_refused_total", {"reason": reason}) or 0


def test_settings_map_principals_to_ingress_topics_that_llmq_topics_creates():
    settings = Settings(kafka={"ingress": {"acme-svc": {"tenant_id": "acme", "classes": ["deferred"]}}})
    assert kafka.ingress_grants(settings) == {  # reply topics: the principal's own by default
        "llmq.ingress.acme-svc": IngressGrant(
            tenant_id="acme", classes=("deferred",), reply_topic_prefixes=("acme-svc.",)
        )
    }
    assert kafka.topic_layout(settings)["llmq.ingress.acme-svc"] == settings.kafka.request_topic_partitions


def test_a_grant_whose_tenant_cannot_scope_ids_or_whose_prefix_is_empty_refuses_to_start():
    for grant in ({"tenant_id": "acme:x"}, {"tenant_id": ""}, {"tenant_id": "acme", "reply_topic_prefixes": [""]}):
        try:
            Settings(kafka={"ingress": {"acme-svc": grant}})
        except ValueError as exc:
            assert "tenant_id" in str(exc) or "reply_topic_prefixes" in str(exc)
        else:
            raise AssertionError(f"accepted the grant {grant}")


def test_a_principal_that_cannot_name_a_topic_refuses_to_start():
    try:
        Settings(kafka={"ingress": {"acme/../x": {"tenant_id": "acme"}}})
    except ValueError as exc:
        assert "kafka ingress principals" in str(exc)
    else:
        raise AssertionError("accepted a principal no topic can be named after")


def test_the_batcher_subscribes_to_the_ingress_topics_too():
    loop, _, _ = make_loop()
    subscribed = []
    loop.consumer.subscribe = lambda topics, listener: subscribed.extend(topics)
    loop.subscribe()
    assert set(subscribed) == {*NAMES.request_topics, TOPIC}


async def test_a_record_of_its_own_tenant_and_class_is_queued():
    loop, producer, metrics = make_loop()
    await put(loop, record())
    assert loop.policy.queued_total == 1 and producer.sent == []
    assert refused(metrics, ErrorCode.TENANT_NOT_ALLOWED) == 0


async def test_a_record_claiming_another_tenant_is_errored_as_its_producers_tenant_and_counted():
    loop, producer, metrics = make_loop()
    await put(loop, record(tenant_id="victim"))
    [sent] = producer.on(NAMES.results_topic)
    result = wire.decode(sent["value"])
    assert (result.outcome, result.error.code, result.error.param) == (
        wire.Outcome.ERRORED,
        ErrorCode.TENANT_NOT_ALLOWED,
        "tenant_id",
    )
    assert result.tenant_id == "acme" and "'victim'" in result.error.message  # nothing lands in the victim's results
    assert result.reply_to == REPLIES and loop.policy.queued_total == 0
    assert refused(metrics, ErrorCode.TENANT_NOT_ALLOWED) == 1


async def test_a_class_the_grant_does_not_allow_is_errored_and_counted():
    loop, producer, metrics = make_loop()
    await put(loop, record(traffic_class="near_interactive"))
    [sent] = producer.on(NAMES.results_topic)
    assert wire.decode(sent["value"]).error.code == ErrorCode.CLASS_NOT_ALLOWED
    assert refused(metrics, ErrorCode.CLASS_NOT_ALLOWED) == 1 and loop.policy.queued_total == 0


async def test_an_http_or_job_reply_on_an_ingress_topic_is_dead_lettered_not_answered():
    loop, producer, metrics = make_loop()
    await put(loop, record(reply_to=wire.HttpReply(instance_id="api-0")), 0)
    await put(loop, record("r2", reply_to=wire.JobReply(batch_id="batch_x", custom_id="c1")), 1)
    assert producer.on(NAMES.results_topic) == [] and loop.policy.queued_total == 0
    assert len(producer.on(NAMES.dead_letters_topic)) == 2
    assert refused(metrics, "reply_not_kafka") == 2


async def test_the_api_pods_topics_keep_trusting_the_records_tenant():
    loop, producer, _ = make_loop()
    request = record(tenant_id="victim", reply_to=wire.HttpReply(instance_id="api-0"))
    await loop.ingest(TopicPartition(NAMES.request_topics[0], 0), Record(offset=0, value=wire.encode(request)))
    assert loop.policy.queued_total == 1 and producer.sent == []


async def test_an_ingress_record_reusing_an_http_request_id_runs_as_its_own_request():
    """Issue 34 item 11: a record whose id an API pod's request held was dropped, unanswered and not dead-lettered
    (the policy took it for that request's duplicate); Kafka-direct ids are tenant-scoped, so they never meet."""
    loop, producer, _ = make_loop()
    http = record("cmpl-local-0123", tenant_id="dev", reply_to=wire.HttpReply(instance_id="api-0"))
    await loop.ingest(TopicPartition(NAMES.request_topics[0], 0), Record(offset=0, value=wire.encode(http)))
    await put(loop, record("cmpl-local-0123"))
    assert loop.policy.queued_total == 2 and producer.sent == []

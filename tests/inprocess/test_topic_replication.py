"""`llmq topics` creates llmq's topics with LLMQ_KAFKA_TOPIC_REPLICATION_FACTOR replicas (the Helm chart's install hook sets
it to the cluster's), against the suite's single real broker."""

import asyncio
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import InvalidReplicationFactorError

from llmq_core.constants import ingress_topic
from llmq_core.kafka import ensure_topics
from llmq_core.settings import IngressGrant, Settings

pytestmark = pytest.mark.integration


async def replicas_of(settings: Settings, topic: str, timeout_s: float = 10.0) -> set[int]:
    """Replica counts of ``topic``'s partitions, once the broker's metadata lists them (a new topic's may lag)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while True:
            (described,) = await admin.describe_topics([topic])
            if described["partitions"] or asyncio.get_running_loop().time() > deadline:
                return {len(partition["replicas"]) for partition in described["partitions"]}
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def test_topics_take_the_configured_replication_factor(settings):
    principal = f"rf-{uuid.uuid4().hex[:8]}"  # its ingress topic is the one topic missing on the broker
    grant = {principal: IngressGrant(tenant_id="rf-tenant")}
    one_broker_too_few = settings.replace(kafka={"ingress": grant, "topic_replication_factor": 2})
    with pytest.raises(InvalidReplicationFactorError):  # the broker was asked for 2 replicas: it has one
        await ensure_topics(one_broker_too_few)
    await ensure_topics(settings.replace(kafka={"ingress": grant, "topic_replication_factor": 1}))
    assert await replicas_of(settings, ingress_topic(principal)) == {1}

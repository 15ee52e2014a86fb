"""Issue 16: the attacks of a stranger on the network, and of one compromised service role, fail against the secure
infra (``llmq dev up --secure``: Kafka SASL_SSL with ACLs, Redis TLS with ACL users). Real broker, real Redis.
Issue 34: the API pods' principal writes no claim or settled result of a batch job, and a Kafka-direct producer reads
its reply topics in its own group.

The application-level forgeries (a forged reply, a forged final_result, a record claiming another tenant) are tested
by their owners against the same infra."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
)
from redis.exceptions import AuthenticationError, ConnectionError, NoPermissionError

from llmq_core import constants, security
from llmq_core.constants import GROUP_BATCHER
from llmq_core.kafka import create_topic, make_admin, make_consumer, make_producer
from llmq_core.redis_client import make_redis
from llmq_core.settings import Settings
from tests.infra import SECURE_INGRESS_PRINCIPALS, SECURE_REPLY_TOPIC_PREFIXES

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT_S = 20


def role(secure_infra, name: str, **changes) -> Settings:
    """``name``'s settings, with ``changes`` (group -> field -> value)."""
    return secure_infra.cfg.settings(name).replace(**changes)


async def bootstraps(settings: Settings) -> bool:
    """Whether an admin client of ``settings`` connects and authenticates (a refusal: False, never a hang)."""
    admin = make_admin(settings)
    try:
        await asyncio.wait_for(admin.start(), CONNECT_TIMEOUT_S)
    except (TimeoutError, KafkaError):
        return False
    await admin.close()
    return True


async def produce(settings: Settings, topic: str, value: bytes = b"forged", key: bytes | None = None) -> None:
    producer = make_producer(settings, request_timeout_ms=5000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def test_kafka_refuses_unauthenticated_and_wrong_password_clients(secure_infra):
    assert await bootstraps(role(secure_infra, "api"))
    assert not await bootstraps(role(secure_infra, "api", kafka={"security_protocol": "PLAINTEXT"}))
    assert not await bootstraps(role(secure_infra, "api", kafka={"sasl_password_file": "", "sasl_password": "guess"}))


async def test_a_principal_cannot_produce_to_another_roles_topic(secure_infra):
    worker = role(secure_infra, security.ROLE_WORKER)
    with pytest.raises(TopicAuthorizationFailedError):  # a worker posing as an API pod
        await produce(worker, constants.requests_topic(constants.INTERACTIVE))
    with pytest.raises(TopicAuthorizationFailedError):  # an API pod forging results
        await produce(role(secure_infra, security.ROLE_API), constants.TOPIC_RESULTS)
    await produce(worker, constants.TOPIC_DEAD_LETTERS)  # its own rows still work


async def test_an_ingress_producer_writes_only_its_own_topic(secure_infra):
    admin = secure_infra.cfg.settings()
    await create_topic(admin, constants.ingress_topic("team-a"))  # topics are the admin's
    team = role(secure_infra, "team-a")
    await produce(team, constants.ingress_topic("team-a"))
    for topic in (constants.requests_topic(constants.INTERACTIVE), constants.ingress_topic("team-b")):
        with pytest.raises(TopicAuthorizationFailedError):  # its principal, not its records, says who it is
            await produce(team, topic)


async def test_the_api_role_cannot_claim_a_batch_job_or_settle_its_lines(secure_infra):
    """Issue 34, item 2: as `api`, one claim {"region": "zzz", "epoch": 7} on llmq.jobs.owners froze another
    tenant's running job, and llmq.jobs.ledger took a forged line result too. Only routers write them now."""
    api = role(secure_infra, security.ROLE_API)
    claim = b'{"batch_id": "batch_probe", "region": "zzz", "epoch": 7}'
    for kind in ("owners", "ledger"):
        with pytest.raises(TopicAuthorizationFailedError):
            await produce(api, constants.job_topic(kind), claim, key=b"batch_probe")


async def test_an_ingress_producer_reads_its_reply_topics_in_its_own_group_only(secure_infra):
    """Issue 34, item 5: the router wrote no reply topic on a secure dev stack and no ingress principal could read
    one; now the router answers under the reply prefixes, and the producer reads there in its own group."""
    principal = SECURE_INGRESS_PRINCIPALS[0]
    topic = f"{SECURE_REPLY_TOPIC_PREFIXES[0]}{uuid.uuid4().hex[:8]}"
    await create_topic(secure_infra.cfg.settings(), topic)
    await produce(role(secure_infra, security.ROLE_ROUTER), topic, b"answer", key=b"r-1")
    producer = role(secure_infra, principal)
    reader = make_consumer(producer, topic, group_id=constants.ingress_group(principal))
    await reader.start()
    try:
        record = await asyncio.wait_for(reader.getone(), CONNECT_TIMEOUT_S)
        assert (record.key, record.value) == (b"r-1", b"answer")
    finally:
        await reader.stop()
    joiner = make_consumer(producer, topic, group_id=GROUP_BATCHER)
    with pytest.raises(GroupAuthorizationFailedError):  # no group but its own
        await joiner.start()
    await joiner.stop()
    snooper = make_consumer(producer, constants.TOPIC_RESULTS, group_id=None)
    with pytest.raises(TopicAuthorizationFailedError):  # nothing outside its reply topics
        await snooper.start()
    await snooper.stop()


async def test_a_principal_cannot_read_another_roles_topic_or_join_its_group(secure_infra):
    reader = make_consumer(role(secure_infra, security.ROLE_API), constants.TOPIC_RESULTS, group_id=None)
    with pytest.raises(TopicAuthorizationFailedError):  # an API pod reading every tenant's answers
        await reader.start()
    await reader.stop()
    sneaky = make_consumer(role(secure_infra, security.ROLE_WORKER), constants.TOPIC_BATCHES, group_id=GROUP_BATCHER)
    with pytest.raises(GroupAuthorizationFailedError):  # a worker taking over the batcher's group
        await sneaky.start()
    await sneaky.stop()


async def test_only_the_admin_creates_topics(secure_infra):
    topic = f"team.replies.{uuid.uuid4().hex[:8]}"
    with pytest.raises(KafkaError):
        await create_topic(role(secure_infra, security.ROLE_ROUTER), topic)
    assert await create_topic(secure_infra.cfg.settings(), topic)


async def test_mtls_client_certificate_is_its_principal(secure_infra):
    secrets, cfg = secure_infra.cfg.secrets, secure_infra.cfg
    mtls = Settings(
        kafka={
            "bootstrap_servers": f"127.0.0.1:{cfg.kafka_tls_port}",
            "security_protocol": "SSL",
            "ssl_cafile": str(secrets.ca),
            "ssl_certfile": str(secrets.cert(security.ROLE_WORKER)),
            "ssl_keyfile": str(secrets.key(security.ROLE_WORKER)),
        },
    )
    await produce(mtls, constants.TOPIC_DEAD_LETTERS)  # User:worker may
    with pytest.raises(TopicAuthorizationFailedError):
        await produce(mtls, constants.requests_topic(constants.DEFERRED))
    assert not await bootstraps(mtls.replace(kafka={"ssl_certfile": "", "ssl_keyfile": ""}))


async def test_redis_refuses_no_password_and_plaintext(secure_infra):
    settings = role(secure_infra, security.ROLE_API)
    no_password = aioredis.Redis.from_url(settings.redis.url, ssl_ca_certs=settings.redis.ssl_cafile)
    with pytest.raises(AuthenticationError):
        await no_password.ping()
    plaintext = aioredis.Redis.from_url(settings.redis.url.replace("rediss://", "redis://"), socket_timeout=5)
    with pytest.raises((ConnectionError, TimeoutError)):
        await plaintext.ping()
    await no_password.aclose()
    await plaintext.aclose()


async def test_only_workers_batchers_and_routers_publish_replies(secure_infra):
    channel = constants.replies_channel("api-0")
    clients = {name: make_redis(role(secure_infra, name)) for name in security.REDIS_ROLES}
    try:
        api = clients[security.ROLE_API]
        listener = api.pubsub()
        await listener.subscribe(channel)  # API pods listen there ...
        with pytest.raises(NoPermissionError):  # ... but cannot forge an answer for another pod's waiter
            await api.publish(channel, b"forged")
        for name in (security.ROLE_WORKER, security.ROLE_BATCHER, security.ROLE_ROUTER):
            await clients[name].publish(channel, name.encode())
        with pytest.raises(NoPermissionError):  # a worker cannot cancel others' work
            await clients[security.ROLE_WORKER].publish(constants.REDIS_CANCELS_CHANNEL, b"x")
        with pytest.raises(NoPermissionError):  # no administration
            await api.config_get("requirepass")
        await listener.aclose()
    finally:
        for client in clients.values():
            await client.aclose()


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1; ::ffff:127.0.0.1 (Java's IPv6 sockets)


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on TCP ``port`` (from /proc/net/tcp and tcp6, hex as the kernel
    writes them)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.parametrize("infra_name", ["infra", "secure_infra"])
def test_kafka_and_redis_listen_on_loopback_only(infra_name, request):
    stack = request.getfixturevalue(infra_name)
    if stack is None or not stack.cfg.manage_infra:
        pytest.skip("Kafka and Redis are not this suite's processes")
    ports = [stack.cfg.kafka_port, stack.cfg.kafka_port + 1, stack.cfg.redis_port]
    if stack.cfg.secure:
        ports.append(stack.cfg.kafka_tls_port)
    for port in ports:
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, (port, addresses)

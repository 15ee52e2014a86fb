"""Where the test suite's Kafka broker and Redis come from (the ``infra`` fixture in tests/conftest.py).

A Docker engine that answers on this machine: testcontainers' Kafka (KRaft) and Redis containers, configured like the
local processes. Otherwise those processes (``llmq_cli.devstack``: a Kafka broker from Maven jars and redis-server)
on ports allocated for the run (tests/ports.py) under ``var/test``, started afresh (a run's leftovers are stopped
and its Kafka data removed first). The engine is probed on its API socket, not through the ``docker`` CLI: a machine can
have the CLI and no engine.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.kafka_dist import BROKER_TUNING
from llmq_core.redis_client import MEMORY_POLICY
from tests import ports

# Where the suite's brokers and Redis sit in their allocated block: the broker (controller +1, the secure one's mTLS
# listener +2) at its start, Redis after it.
KAFKA_OFFSET = 0
REDIS_OFFSET = 5
INFRA_PORTS = 10
SECURE_REPLY_TOPIC_PREFIXES = ("team.replies.",)
SECURE_INGRESS_PRINCIPALS = ("team-a",)  # a Kafka-direct producer: writes llmq.ingress.team-a only
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"  # Kafka 3.9 in KRaft mode
REDIS_IMAGE = "redis:7.4"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def engine_address(docker_host: str | None) -> tuple[socket.AddressFamily, str | tuple[str, int]] | None:
    """Socket address of the engine DOCKER_HOST names (unset: the default socket), or None for one that is not on
    this machine: a container's ports are published where the engine runs, and the suite reaches 127.0.0.1 only."""
    url = urlsplit(docker_host or DEFAULT_DOCKER_HOST)
    if url.scheme == "unix":
        return socket.AF_UNIX, url.path
    if url.scheme == "tcp" and url.hostname in LOCAL_HOSTS:
        return (socket.AF_INET6 if ":" in url.hostname else socket.AF_INET), (url.hostname, url.port or 2375)
    return None


def docker_engine_answers(docker_host: str | None, timeout_s: float = 2.0) -> bool:
    """Whether a local Docker engine answers its API's ``GET /_ping`` with 200."""
    address = engine_address(docker_host)
    if address is None:
        return False
    family, target = address
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(target)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64).split(b"\r\n", 1)[0]
    except OSError:
        return False
    return status_line.split(b" ")[1:2] == [b"200"]


def infra_kind(docker_host: str | None) -> str:
    """``containers`` when a local Docker engine answers, else ``processes``."""
    return "containers" if docker_engine_answers(docker_host) else "processes"


def allocated_ports() -> dict[str, int]:
    """A broker's and a Redis' ports for this run, from one allocated block."""
    base = ports.block(INFRA_PORTS)
    return {"kafka_port": base + KAFKA_OFFSET, "redis_port": base + REDIS_OFFSET}


def fresh_infra(cfg: StackConfig) -> DevStack:
    """``cfg``'s Kafka and Redis up as new: what an interrupted run left under its state dir stopped, and its Kafka
    data removed (formatted again: a new cluster on this run's ports, SCRAM users of today's principals)."""
    stack = DevStack(cfg)
    stack.down()
    shutil.rmtree(cfg.state_dir / "kafka-data", ignore_errors=True)
    stack.up(services=False, log=lambda *_: None)
    return stack


@contextlib.contextmanager
def suite_infra(state_dir: Path, docker_host: str | None) -> Iterator[DevStack]:
    """Kafka and Redis for the session, as the DevStack whose config private stacks of services copy."""
    if infra_kind(docker_host) == "containers":
        with containers() as (kafka_port, redis_port):
            yield DevStack(
                StackConfig(state_dir=state_dir, kafka_port=kafka_port, redis_port=redis_port, manage_infra=False)
            )
        return
    stack = fresh_infra(StackConfig(state_dir=state_dir, **allocated_ports()))
    try:
        yield stack
    finally:
        stack.down()


@contextlib.contextmanager
def secure_suite_infra(state_dir: Path) -> Iterator[DevStack]:
    """A secure Kafka and Redis (``llmq dev up --secure``: TLS, SCRAM, ACLs, Redis ACL users) as local processes,
    whatever the plaintext pair runs on: the stack whose config secure private stacks copy."""
    cfg = StackConfig(
        state_dir=state_dir,
        **allocated_ports(),
        secure=True,
        reply_topic_prefixes=SECURE_REPLY_TOPIC_PREFIXES,
        ingress_principals=SECURE_INGRESS_PRINCIPALS,
    )
    stack = fresh_infra(cfg)
    try:
        yield stack
    finally:
        stack.down()


def kafka_env() -> dict[str, str]:
    """:data:`BROKER_TUNING` as the confluent image's environment (``KAFKA_A_B`` sets ``a.b``)."""
    return {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in BROKER_TUNING.items()}


def redis_command(maxmemory_bytes: int) -> str:
    """redis-server as the local one runs: no persistence, bounded memory, llmq's eviction policy."""
    return f"redis-server --save '' --appendonly no --maxmemory {maxmemory_bytes} --maxmemory-policy {MEMORY_POLICY}"


@contextlib.contextmanager
def containers() -> Iterator[tuple[int, int]]:
    """testcontainers' Kafka and Redis, up for the ``with`` block; yields their ports published on this machine."""
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.redis import RedisContainer

    kafka = KafkaContainer(KAFKA_IMAGE).with_kraft()
    for key, value in kafka_env().items():
        kafka.with_env(key, value)
    redis = RedisContainer(REDIS_IMAGE).with_command(redis_command(StackConfig().redis_maxmemory_bytes))
    with kafka, redis:
        yield int(kafka.get_exposed_port(kafka.port)), int(redis.get_exposed_port(redis.port))

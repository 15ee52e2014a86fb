"""Where the test suite's Kafka broker and Redis come from (the ``infra`` fixture in tests/conftest.py).

``LLMQ_TEST_INFRA`` says which (an engine that happens to answer never decides it):

- ``processes`` (the default): ``llmq_cli.devstack``'s broker from the Maven jars and redis-server, on ports allocated
  for the run (tests/ports.py) under ``var/test``, started afresh (a run's leftovers stopped, its Kafka data removed).
- ``containers`` (``make test-containers``): the same broker and Redis as testcontainers containers of the images
  ``make images`` builds (the tags docker-compose.yml names; never pulled: a missing image fails the run), on the
  host's network, so they listen on 127.0.0.1 at the allocated ports with the processes' configuration. Ryuk is off
  (its image is in no registry here): the suite removes them at its end, and a run's start removes those an
  interrupted run left under its state dir (a label). Needs a Docker engine on this machine (DOCKER_HOST or the
  default socket), probed on its API socket, not through the ``docker`` CLI: a machine can have the CLI and no engine.

Either way the secure broker and Redis, the two regions, the Kafka outage and the fault tests' brokers stay processes
of their own (their tests stop, restart and reconfigure them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from llmq_cli.devstack import DevStack, StackConfig, redis_server_argv
from llmq_cli.kafka_dist import cluster_id, server_properties
from tests import ports

ROOT = Path(__file__).resolve().parent.parent

# Where the suite's brokers and Redis sit in their allocated block: the broker (controller +1, the secure one's mTLS
# listener +2) at its start, Redis after it.
KAFKA_OFFSET = 0
REDIS_OFFSET = 5
INFRA_PORTS = 10
SECURE_REPLY_TOPIC_PREFIXES = ("team.replies.",)
SECURE_INGRESS_PRINCIPALS = ("team-a",)  # a Kafka-direct producer: writes llmq.ingress.team-a only
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
INFRA_SETTING = "LLMQ_TEST_INFRA"
INFRA_KINDS = ("processes", "containers")
CONTAINER_LABEL = "llmq.test.state-dir"  # the suite's containers: which state dir's run started them
CONTAINER_KAFKA_DATA = Path("/var/lib/kafka/data")  # the llmq-kafka image's log dir (deploy/images/kafka.Dockerfile)
CONTAINER_REDIS_DIR = Path("/data")  # the llmq-redis image's working dir, its redis user's


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


def infra_kind(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """``LLMQ_TEST_INFRA``: ``processes`` (unset or empty) or ``containers``. Raises ValueError for anything else."""
    kind = environ.get(INFRA_SETTING) or "processes"
    if kind not in INFRA_KINDS:
        raise ValueError(f"{INFRA_SETTING}={kind!r}: want one of {', '.join(INFRA_KINDS)}")
    return kind


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
def suite_infra(state_dir: Path, docker_host: str | None, kind: str = "processes") -> Iterator[DevStack]:
    """Kafka and Redis for the session, as the DevStack whose config private stacks of services copy; ``kind``: see
    :func:`infra_kind`."""
    if kind == "containers":
        cfg = StackConfig(state_dir=state_dir, **allocated_ports(), manage_infra=False)
        with containers(docker_host, str(state_dir), cfg.kafka_port, cfg.redis_port, cfg.redis_maxmemory_bytes):
            stack = DevStack(cfg)
            stack.up(services=False, log=lambda *_: None)  # waits for both, creates the llmq topics
            yield stack
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


def property_env(properties: str) -> dict[str, str]:
    """Broker properties (``name=value`` lines) as the llmq-kafka image's environment: ``KAFKA_<NAME>`` with ``.`` ->
    ``_``, ``_`` -> ``__``, ``-`` -> ``___`` (deploy/images/kafka-start.sh reads them back)."""
    env = {}
    for line in filter(None, properties.splitlines()):
        name, _, value = line.partition("=")
        env["KAFKA_" + name.replace("_", "__").replace("-", "___").replace(".", "_").upper()] = value
    return env


def compose_image(service: str) -> str:
    """The image docker-compose.yml runs ``service`` from: a tag ``make images`` builds."""
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]["image"]


@contextlib.contextmanager
def containers(
    docker_host: str | None, label: str, kafka_port: int, redis_port: int, redis_maxmemory_bytes: int
) -> Iterator[None]:
    """The llmq-kafka and llmq-redis containers for the ``with`` block, on the host's network: the broker (its
    controller on ``kafka_port`` + 1) and Redis listen on 127.0.0.1 as the local processes do, configured alike.
    ``label``: what marks them as this run's; containers an earlier run left with it are removed first. Raises
    RuntimeError when no engine answers or an image is missing (never pulled)."""
    if not docker_engine_answers(docker_host):
        raise RuntimeError(
            f"{INFRA_SETTING}=containers: no Docker engine answers at {docker_host or DEFAULT_DOCKER_HOST}"
        )
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient

    testcontainers_config.ryuk_disabled = True
    client = DockerClient().client
    for image in (compose_image("kafka"), compose_image("redis")):
        if not client.images.list(name=image):
            raise RuntimeError(f"{INFRA_SETTING}=containers: no image {image} on the engine (make images builds it)")
    for leftover in client.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}={label}"}):
        leftover.remove(force=True)
    options = {"network_mode": "host", "labels": {CONTAINER_LABEL: label}}
    properties = server_properties(CONTAINER_KAFKA_DATA, kafka_port, kafka_port + 1)
    kafka = (
        DockerContainer(compose_image("kafka"))
        .with_envs(**property_env(properties), CLUSTER_ID=cluster_id(), KAFKA_HEALTH_PORT=str(kafka_port))
        .with_kwargs(**options)
    )
    argv = redis_server_argv(redis_port, CONTAINER_REDIS_DIR, redis_maxmemory_bytes)
    redis = (
        DockerContainer(compose_image("redis"))
        .with_command(argv)
        .with_env("REDIS_HEALTH_PORT", str(redis_port))
        .with_kwargs(**options)
    )
    with kafka, redis:
        yield

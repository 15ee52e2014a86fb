"""tests/infra.py: the suite runs Kafka and Redis in testcontainers' containers only when a Docker engine answers."""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import stat
import threading
from pathlib import Path

import pytest

from llmq_cli.kafka_dist import BROKER_TUNING
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES
from llmq_core.redis_client import MEMORY_POLICY
from tests import infra


class FakeEngine(socketserver.StreamRequestHandler):
    """Answers any request with the status line the server was given, as the engine's /_ping would."""

    def handle(self):
        self.rfile.readline()
        self.wfile.write(self.server.status_line + b"\r\nContent-Length: 2\r\n\r\nOK")


@contextlib.contextmanager
def engine(server: socketserver.BaseServer, status_line: bytes):
    server.status_line = status_line
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def socket_path(tmp_path) -> Path:
    return tmp_path / "docker.sock"


def test_an_engine_answering_on_its_socket_means_containers(socket_path):
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 200 OK"):
        assert infra.infra_kind(f"unix://{socket_path}") == "containers"


def test_an_engine_answering_on_local_tcp_means_containers():
    with engine(socketserver.TCPServer(("127.0.0.1", 0), FakeEngine), b"HTTP/1.1 200 OK") as server:
        assert infra.infra_kind(f"tcp://127.0.0.1:{server.server_address[1]}") == "containers"


def test_no_socket_means_processes(socket_path):
    assert infra.infra_kind(f"unix://{socket_path}") == "processes"


def test_a_docker_cli_without_an_engine_means_processes(tmp_path, socket_path, monkeypatch):
    """This machine's case: `docker` is on PATH, nothing listens on the engine's socket (a stale socket file)."""
    cli = tmp_path / "bin" / "docker"
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\necho 'Docker version 28.0.0'\n")
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{cli.parent}{os.pathsep}{os.environ['PATH']}")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(socket_path))  # the file exists; no engine listens on it
    stale.close()
    assert infra.infra_kind(f"unix://{socket_path}") == "processes"


def test_an_engine_answering_an_error_means_processes(socket_path):
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 500 Internal Server Error"):
        assert infra.infra_kind(f"unix://{socket_path}") == "processes"


def test_a_remote_engine_means_processes():
    """Its containers' ports would be published on another machine, not on 127.0.0.1 where the services look."""
    assert infra.engine_address("tcp://10.0.0.5:2375") is None
    assert infra.engine_address("ssh://builder@example") is None
    assert infra.infra_kind("tcp://10.0.0.5:2375") == "processes"


def test_unset_docker_host_probes_the_default_socket():
    assert infra.engine_address(None) == (socket.AF_UNIX, "/var/run/docker.sock")


def test_with_an_engine_the_suite_runs_on_the_containers_ports(socket_path, tmp_path, monkeypatch):
    started = []

    @contextlib.contextmanager
    def containers():
        started.append(True)
        yield 32771, 32772

    monkeypatch.setattr(infra, "containers", containers)
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 200 OK"):
        with infra.suite_infra(tmp_path, f"unix://{socket_path}") as stack:
            assert (stack.cfg.kafka_bootstrap, stack.cfg.redis_url) == ("127.0.0.1:32771", "redis://127.0.0.1:32772/0")
            assert stack.cfg.manage_infra is False  # private stacks of services start no Kafka or Redis of their own
    assert started == [True]


def test_the_kafka_container_gets_the_local_brokers_settings():
    env = infra.kafka_env()
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_MESSAGE_MAX_BYTES"] == str(KAFKA_MAX_MESSAGE_BYTES)
    assert env["KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS"] == "4"
    assert len(env) == len(BROKER_TUNING)


def test_the_redis_container_runs_like_the_local_one():
    command = infra.redis_command(1024).split()
    assert command[command.index("--maxmemory") + 1] == "1024"
    assert command[command.index("--maxmemory-policy") + 1] == MEMORY_POLICY

"""tests/infra.py: the suite's Kafka and Redis are processes unless LLMQ_TEST_INFRA says containers (an engine that
answers never decides it); containers run the images ``make images`` builds, configured like the processes."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import socketserver
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from llmq_cli import kafka_dist
from llmq_cli.devstack import DevStack
from llmq_cli.kafka_dist import BROKER_TUNING, KAFKA_VERSION, server_properties
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


def test_the_suite_runs_processes_unless_the_setting_says_containers(socket_path, monkeypatch):
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 200 OK"):
        monkeypatch.setenv("DOCKER_HOST", f"unix://{socket_path}")  # an engine answers: it changes nothing
        assert infra.docker_engine_answers(f"unix://{socket_path}")
        assert infra.infra_kind({}) == infra.infra_kind({"LLMQ_TEST_INFRA": ""}) == "processes"
    assert infra.infra_kind({"LLMQ_TEST_INFRA": "containers"}) == "containers"
    with pytest.raises(ValueError, match="LLMQ_TEST_INFRA='docker'"):
        infra.infra_kind({"LLMQ_TEST_INFRA": "docker"})


def test_an_engine_answering_on_its_socket_or_local_tcp_answers(socket_path):
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 200 OK"):
        assert infra.docker_engine_answers(f"unix://{socket_path}")
    with engine(socketserver.TCPServer(("127.0.0.1", 0), FakeEngine), b"HTTP/1.1 200 OK") as server:
        assert infra.docker_engine_answers(f"tcp://127.0.0.1:{server.server_address[1]}")


def test_no_socket_or_an_error_is_no_engine(socket_path):
    assert not infra.docker_engine_answers(f"unix://{socket_path}")
    with engine(socketserver.UnixStreamServer(str(socket_path), FakeEngine), b"HTTP/1.1 500 Internal Server Error"):
        assert not infra.docker_engine_answers(f"unix://{socket_path}")


def test_a_docker_cli_without_an_engine_is_no_engine(tmp_path, socket_path, monkeypatch):
    """This machine's usual case: `docker` is on PATH, nothing listens on the engine's socket (a stale socket file)."""
    cli = tmp_path / "bin" / "docker"
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\necho 'Docker version 28.0.0'\n")
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{cli.parent}{os.pathsep}{os.environ['PATH']}")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(socket_path))  # the file exists; no engine listens on it
    stale.close()
    assert not infra.docker_engine_answers(f"unix://{socket_path}")


def test_a_remote_engine_is_none_of_ours():
    """Its containers would listen on another machine, not on 127.0.0.1 where the services look."""
    assert infra.engine_address("tcp://10.0.0.5:2375") is None
    assert infra.engine_address("ssh://builder@example") is None
    assert not infra.docker_engine_answers("tcp://10.0.0.5:2375")


def test_unset_docker_host_probes_the_default_socket():
    assert infra.engine_address(None) == (socket.AF_UNIX, "/var/run/docker.sock")


def test_containers_without_an_engine_fail_the_run_rather_than_fall_back(socket_path):
    with pytest.raises(RuntimeError, match="no Docker engine answers"):
        with infra.containers(f"unix://{socket_path}", "x", 1, 2, 3):
            pass


def test_in_containers_the_suite_runs_on_their_ports_and_starts_no_infra_of_its_own(tmp_path, monkeypatch):
    started = []

    @contextlib.contextmanager
    def containers(docker_host, label, kafka_port, redis_port, redis_maxmemory_bytes):
        started.append((docker_host, label, kafka_port, redis_port))
        yield

    monkeypatch.setattr(infra, "containers", containers)
    monkeypatch.setattr(DevStack, "up", lambda self, **_: None)
    with infra.suite_infra(tmp_path, "unix:///x.sock", "containers") as stack:
        kafka_port, redis_port = stack.cfg.kafka_port, stack.cfg.redis_port
        assert stack.cfg.manage_infra is False  # private stacks of services start no Kafka or Redis of their own
    assert started == [("unix:///x.sock", str(tmp_path), kafka_port, redis_port)]


def test_the_containers_are_the_compose_files_images_of_make_images():
    assert infra.compose_image("kafka") == f"llmq-kafka:{KAFKA_VERSION}"  # the dev stack's broker version
    assert infra.compose_image("redis").startswith("llmq-redis:")


def test_the_kafka_container_gets_the_local_brokers_properties(tmp_path):
    """deploy/images/kafka-start.sh turns the environment back into exactly the local broker's properties."""
    properties = server_properties(infra.CONTAINER_KAFKA_DATA, 29092, 29093)
    env = infra.property_env(properties) | {"PATH": os.environ["PATH"], "KAFKA_PROPERTIES_FILE": str(tmp_path / "p")}
    start = Path(infra.ROOT) / "deploy" / "images" / "kafka-start.sh"
    done = subprocess.run(["bash", str(start), "--properties"], env=env, capture_output=True, text=True, check=True)
    assert sorted(done.stdout.splitlines()) == sorted(filter(None, properties.splitlines()))
    assert all(f"{key}={value}" in done.stdout.splitlines() for key, value in BROKER_TUNING.items())


def test_property_names_with_underscores_and_dashes_survive():
    assert infra.property_env("a.b_c-d=1") == {"KAFKA_A_B__C___D": "1"}


def test_a_kraft_cluster_id_is_a_uuid_in_url_safe_base64_that_reads_as_no_option():
    ids = {kafka_dist.cluster_id() for _ in range(500)}  # about 8 of 500 random ids start with "-": each drawn again
    assert len(ids) == 500 and all(len(i) == 22 and "=" not in i and not i.startswith("-") for i in ids)
    assert all(base64.urlsafe_b64decode(i + "==") for i in ids)


def test_a_jvm_maps_the_class_archive_of_its_jars_once_it_was_made(tmp_path, monkeypatch):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", str(java.parent))
    libs = tmp_path / "kafka" / "libs"
    archive = kafka_dist.class_archive(libs)
    assert archive is not None and archive.parent == libs.parent
    assert not any(flag.startswith("-XX:SharedArchiveFile") for flag in kafka_dist.java_command(libs, "Main"))
    libs.mkdir(parents=True)
    archive.write_bytes(b"")
    argv = kafka_dist.java_command(libs, "Main")
    assert argv[argv.index(f"-XX:SharedArchiveFile={archive}") + 1 :] == ["-Xmx512m", "-cp", f"{libs}/*", "Main"]
    java.write_text("#!/bin/sh\n# another build\n")  # another JVM: an archive of its own, trained again
    assert kafka_dist.class_archive(libs) != archive


def test_without_java_there_is_no_class_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert kafka_dist.class_archive(tmp_path / "libs") is None

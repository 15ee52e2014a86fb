"""An Apache Kafka broker (KRaft) and MirrorMaker 2 assembled from Maven Central jars, cached outside the clone.

apache.org downloads may be unreachable where Maven Central is not, so the broker's jars are resolved with Maven into
``~/.cache/llmq/kafka-<version>-r<recipe>/libs`` once, and MirrorMaker 2's (``org.apache.kafka:connect-mirror`` of the
same version, with a log4j binding so that it logs) into ``~/.cache/llmq/connect-mirror-<version>-r<recipe>/libs``;
every later clone reuses them.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

KAFKA_VERSION = os.environ.get("LLMQ_KAFKA_VERSION", "4.1.2")
LOG4J_VERSION = "2.24.3"
RECIPE = 2  # bump when the jar set changes, so caches of an older recipe are not reused
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.llmq</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

MIRROR_RECIPE = 1  # bump when MirrorMaker 2's jar set changes
MIRROR_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.llmq</groupId><artifactId>connect-mirror</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-mirror</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

LOG4J2_YAML = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.BrokerServer
        level: INFO
"""


# MirrorMaker 2's log4j2 configuration: its jars have no YAML parser. Its own progress at INFO, the clients' at WARN.
MIRROR_LOG4J2_PROPERTIES = """appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = STDOUT
logger.mirror.name = org.apache.kafka.connect.mirror
logger.mirror.level = INFO
"""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMQ_CACHE_DIR", Path.home() / ".cache" / "llmq"))


def libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_dir() / f"kafka-{version}-r{RECIPE}" / "libs"


def mirror_libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_dir() / f"connect-mirror-{version}-r{MIRROR_RECIPE}" / "libs"


def ensure_installed(version: str = KAFKA_VERSION) -> Path:
    """Resolve the broker's jars with Maven unless cached, and archive the classes a broker loads
    (:func:`ensure_class_archive`). Returns the folder of jars.

    Raises RuntimeError when Maven is missing or the resolution fails.
    """
    libs = _resolve(POM, libs_dir(version), version)
    ensure_class_archive(libs)
    return libs


def ensure_mirror_installed(version: str = KAFKA_VERSION) -> Path:
    """Resolve MirrorMaker 2's jars (``connect-mirror``, the broker's version) unless cached; the folder of jars."""
    return _resolve(MIRROR_POM, mirror_libs_dir(version), version)


def _resolve(pom_template: str, libs: Path, version: str) -> Path:
    marker = libs.parent / ".complete"
    if marker.exists():
        return libs
    if shutil.which("mvn") is None:
        raise RuntimeError("mvn (Apache Maven) is required to assemble Kafka's jars: apt-get install maven")
    libs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(pom_template.format(kafka=version, log4j=LOG4J_VERSION))
        subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-f",
                str(pom),
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            check=True,
        )
    marker.touch()
    return libs


# Broker settings past its listeners and storage, tuned for fast consumer-group joins in tests: the local broker here
# and the test suite's Kafka container (tests/infra.py) both run with them.
BROKER_TUNING = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",  # owners create their topics (reply topics: `llmq dev create-topic`)
    "message.max.bytes": str(KAFKA_MAX_MESSAGE_BYTES),  # default of topics without their own max.message.bytes
    "replica.fetch.max.bytes": str(KAFKA_MAX_MESSAGE_BYTES),
    # The group coordinator writes each offset commit at once instead of lingering 5 ms for more to batch: with a few
    # consumers committing every KAFKA_COMMIT_INTERVAL_MS there is little to batch, and the linger's timer made a
    # commit cost 1.0-1.2 ms of broker CPU and 6.5 ms until acknowledged; without it 0.3-0.4 ms and 0.6 ms.
    "group.coordinator.append.linger.ms": "0",
}


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """A single-node KRaft broker+controller on 127.0.0.1 with :data:`BROKER_TUNING`."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data_dir}",
            *(f"{key}={value}" for key, value in BROKER_TUNING.items()),
            "",
        ]
    )


def secure_server_properties(
    data_dir: Path, port: int, controller_port: int, tls_port: int, tls: dict[str, str], super_users: list[str]
) -> str:
    """A single-node KRaft broker with no PLAINTEXT listener: clients on ``port`` (SASL_SSL, SCRAM-SHA-512), mTLS
    clients and the broker itself on ``tls_port`` (SSL, client certificate required), the controller on
    ``controller_port`` (SSL, client certificate required: only the broker's certificate passes the authorizer).
    ``tls``: PEM paths ``keystore`` (key + certificate) and ``ca``. StandardAuthorizer, no access without an ACL."""
    tls_listeners = ("tls", "controller")
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=CLIENT://127.0.0.1:{port},TLS://127.0.0.1:{tls_port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=CLIENT://127.0.0.1:{port},TLS://127.0.0.1:{tls_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=TLS",
            "listener.security.protocol.map=CLIENT:SASL_SSL,TLS:SSL,CONTROLLER:SSL",
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "listener.name.client.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            *(f"listener.name.{name}.ssl.client.auth=required" for name in tls_listeners),
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={tls['keystore']}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls['ca']}",
            "ssl.principal.mapping.rules=RULE:^CN=([A-Za-z0-9._-]+)$/$1/,DEFAULT",  # certificate CN=x -> User:x
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            "super.users=" + ";".join(f"User:{user}" for user in super_users),
            f"log.dirs={data_dir}",
            *(f"{key}={value}" for key, value in BROKER_TUNING.items()),
            "",
        ]
    )


# The local JVMs' flags. C1 only (TieredStopAtLevel=1): a broker of a dev or test stack lives minutes, and C2's
# compiler threads were 40% of its CPU during a benchmark's load (2.7 of 6.3 ms per pipeline request) and most of it
# when idle; C1's code is a little slower but compiles in a fraction of the time. Production brokers keep the JVM's
# defaults (README, Performance).
JVM_FLAGS = ("-Xms256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def java_command(libs: Path, *args: str, heap: str = "-Xmx512m") -> list[str]:
    """``java`` with :data:`JVM_FLAGS` on the jars of ``libs``, mapping their class archive when it was made."""
    archive = class_archive(libs)
    share = (f"-XX:SharedArchiveFile={archive}",) if archive is not None and archive.exists() else ()
    return ["java", *JVM_FLAGS, *share, heap, "-cp", f"{libs}/*", *args]


# Class data sharing (AppCDS): the classes a broker loads, archived once per machine and JVM by a short training run;
# every JVM on the same jars (brokers, StorageTool) maps them instead of reading and verifying them from the jars again.
# Measured here (2 cores): a broker listens after 1.9 s instead of 3.3 s and has spent 3.1 instead of 4.6 CPU s 8 s
# after its start; a StorageTool run takes 0.6 s instead of 1.1 s. A test run starts dozens of them.
TRAINING_TIMEOUT_S = 120


def class_archive(libs: Path) -> Path | None:
    """Where the class archive of ``libs`` for this machine's JVM lives (None without a ``java``): named by the
    JVM's library, so that another JDK trains its own (a JVM refuses an archive of another build anyway)."""
    found = shutil.which("java")
    if found is None:
        return None
    java = Path(found).resolve()
    home = java.parent.parent
    libjvm = home / "lib" / "server" / "libjvm.so"
    stat = (libjvm if libjvm.exists() else java).stat()
    key = hashlib.sha256(f"{home}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return libs.parent / f"classes-{key}.jsa"


def ensure_class_archive(libs: Path) -> None:
    """Make :func:`class_archive` of ``libs`` unless it exists: a broker on free ports in a scratch folder, stopped
    once it listens, dumps the classes it loaded at exit. Best effort: without the archive JVMs load their classes
    from the jars, as before."""
    archive = class_archive(libs)
    if archive is None or archive.exists():
        return
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="llmq-kafka-training-") as scratch:
        work = Path(scratch)
        port, controller_port = _free_port(), _free_port()
        config = work / "server.properties"
        config.write_text(server_properties(work / "data", port, controller_port))
        log4j = work / "log4j2.yaml"
        log4j.write_text(LOG4J2_YAML)
        format_storage(libs, config, work / "data")
        argv = java_command(
            libs,
            f"-XX:ArchiveClassesAtExit={partial}",
            f"-Dlog4j2.configurationFile={log4j}",
            "kafka.Kafka",
            str(config),
        )
        broker = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            listening = _wait_listening(port, broker, TRAINING_TIMEOUT_S)
        finally:
            broker.terminate()  # a clean exit: the JVM writes the archive after the broker's shutdown
            broker.wait(TRAINING_TIMEOUT_S)
    if listening and partial.exists():
        os.replace(partial, archive)  # whole or not at all: another JVM may be starting beside this one
    else:
        partial.unlink(missing_ok=True)
        log.warning(
            "no class archive for %s: the training broker did not start (JVMs load classes from the jars)", libs
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` (a broker listening)."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_listening(port: int, process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if tcp_open(port):
            return True
        time.sleep(0.1)
    return False


def cluster_id() -> str:
    """A new KRaft cluster id as ``StorageTool random-uuid`` makes it (without a JVM): a random UUID's 16 bytes,
    URL-safe base64 without padding, never starting with "-" (a command line would read it as an option)."""
    while (new := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return new


def format_storage(libs: Path, config: Path, data_dir: Path, scram_users: dict[str, str] | None = None) -> None:
    """Format the KRaft storage once (a formatted data dir is kept: re-formatting with a new cluster id would fail).
    ``scram_users`` (name -> password): SCRAM-SHA-512 credentials written into the metadata at this step."""
    if (data_dir / "meta.properties").exists():
        return
    subprocess.run(
        java_command(
            libs,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id(),
            "-c",
            str(config),
            "--ignore-formatted",
            *(
                arg
                for name, password in (scram_users or {}).items()
                for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
            ),
        ),
        check=True,
        capture_output=True,
    )

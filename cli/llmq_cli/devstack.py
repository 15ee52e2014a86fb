"""The local llmq stack as plain processes: Kafka, Redis, API pods, batcher, workers, result-router; one per region
(``StackConfig.region``), with MirrorMaker 2 copying the peer region's batch-job topics into it (:meth:`DevStack.mirror`).

Each process started here gets a pid file (``<state>/pids/<name>.json``) and a log file (``<state>/logs/<name>.log``);
``down`` stops exactly those processes (it checks each pid's command line first) and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis as redis_sync

from llmq_cli import kafka_dist, mirror
from llmq_cli.devsecrets import DevSecrets
from llmq_core import constants, ids, security
from llmq_core.kafka import ensure_topics, reply_topic_prefixes
from llmq_core.models import SMOLLM2_135M_INSTRUCT
from llmq_core.redis_client import MEMORY_POLICY, connection_options
from llmq_core.settings import Settings


@dataclass(frozen=True)
class ProcSpec:
    """One process of the stack. ``marker`` must appear in its command line (guards against reused pids)."""

    name: str
    kind: str
    argv: list[str]
    marker: str
    model: str = ""
    port: int = 0
    alive: str = ""  # Redis liveness key for services without an HTTP port
    metrics_port: int = 0  # Prometheus /metrics on 127.0.0.1 (API pods too: never on their API ``port``)


@dataclass
class StackConfig:
    """Shape of a local stack. Ports are on 127.0.0.1."""

    state_dir: Path = Path("var/dev")
    kafka_port: int = 9092
    redis_port: int = 6379
    api_ports: tuple[int, ...] = (8000, 8001)
    tiny_workers: int = 1
    sim_workers: int = 2
    sim_batch_time_ms: int = 500
    sim_max_batch_size: int = 64
    sim_worker_args: tuple[str, ...] = ()  # appended to every llmq-sim worker's argv (e.g. ``--poison-marker X``)
    smollm2_workers: int = 0  # real-model workers (smollm2-135m-instruct): only stacks that ask get one (`dev up` does)
    batchers: int = 1  # batcher processes, one consumer group (instance ids batcher-0, batcher-1, ...)
    routers: int = 1  # result-router processes, one consumer group (result-router-0, ...)
    extra_env: dict[str, str] = field(default_factory=dict)
    manage_infra: bool = True  # False: Kafka and Redis at these ports are someone else's; start and stop only services
    redis_maxmemory_bytes: int = field(default_factory=lambda: Settings().dev.redis_maxmemory_bytes)
    # secure mode (docs/security.md): Kafka SASL_SSL + ACLs, Redis TLS + ACL users, one principal per role
    secure: bool = False
    # where the router may write replies (secure: its ACLs; ingress principals read theirs); default: the settings'
    reply_topic_prefixes: tuple[str, ...] = field(default_factory=lambda: reply_topic_prefixes(Settings()))
    # Kafka-direct producers (LLMQ_KAFKA_INGRESS): secure mode gives each a SCRAM user that writes its ingress topic only
    ingress_principals: tuple[str, ...] = field(default_factory=lambda: tuple(Settings().kafka.ingress))
    region: str = ids.DEFAULT_REGION  # LLMQ_REGION of every service: in their ids, metrics and log lines
    peer_regions: tuple[str, ...] = ()  # regions mirrored to and from (secure mode: mm2's and the router's ACLs)

    @classmethod
    def for_region(cls, region: str, port_base: int, state_dir: Path = Path("var/dev"), **config) -> StackConfig:
        """A whole region's stack on ports from ``port_base`` (Kafka +0, its controller +1, secure mTLS +2, Redis +5,
        API pods +10 and +11, /metrics from +20), its state in ``state_dir/<region>``: regions side by side on one
        machine take bases at least 100 apart."""
        return cls(
            state_dir=state_dir / ids.check_region(region),
            kafka_port=port_base,
            redis_port=port_base + REGION_REDIS_OFFSET,
            api_ports=(port_base + REGION_API_OFFSET, port_base + REGION_API_OFFSET + 1),
            region=region,
            **config,
        )

    def instance_id(self, name: str) -> str:
        """A process's id in this stack's region (what the process itself makes of ``name``)."""
        return ids.instance_id(self.region, name)

    @property
    def secrets(self) -> DevSecrets:
        return DevSecrets(self.state_dir.resolve() / "secrets")

    @property
    def kafka_tls_port(self) -> int:
        """Secure mode: the mTLS listener (clients with a certificate, and the broker itself); controller is +1."""
        return self.kafka_port + 2

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def metrics_base_port(self) -> int:
        """/metrics ports: result-router this, batcher +1, workers +2, +3, ..., then the API pods, then the second and
        later batchers and result-routers (:meth:`replica_metrics_port`)."""
        return self.api_ports[0] + 10 if self.api_ports else 0

    @property
    def workers(self) -> int:
        """Workers of every model: they own partitions 0.. of llmq.batches, in the order :func:`service_specs` starts them."""
        return self.tiny_workers + self.sim_workers + self.smollm2_workers

    def replica_metrics_port(self, index: int, slot: int) -> int:
        """/metrics port of batcher (``slot`` 1) or result-router (``slot`` 0) number ``index``: the first at the
        base + ``slot``, the others after the API pods' ports, two per index (0 without a base: no API pods)."""
        base = self.metrics_base_port
        if not base or index == 0:
            return base and base + slot
        return base + 2 + self.workers + len(self.api_ports) + 2 * (index - 1) + (1 - slot)

    @property
    def redis_url(self) -> str:
        return f"{'rediss' if self.secure else 'redis'}://127.0.0.1:{self.redis_port}/0"

    def env(self, role: str = security.ROLE_ADMIN) -> dict[str, str]:
        """``LLMQ_*`` connection settings of ``role`` (an llmq service's, or the admin's: topics, ACLs, status)."""
        env = {
            "LLMQ_KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "LLMQ_REDIS_URL": self.redis_url,
            "LLMQ_REGION": self.region,
        }
        if self.reply_topic_prefixes:
            env["LLMQ_KAFKA_REPLY_TOPIC_PREFIXES"] = ",".join(self.reply_topic_prefixes)
        if self.peer_regions:
            env["LLMQ_REGION_PEERS"] = ",".join(self.peer_regions)
        if self.secure:
            secrets = self.secrets
            env |= {
                "LLMQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "LLMQ_KAFKA_SASL_USERNAME": role,
                "LLMQ_KAFKA_SASL_PASSWORD_FILE": str(secrets.password_file(role)),
                "LLMQ_KAFKA_SSL_CAFILE": str(secrets.ca),
                "LLMQ_REDIS_USERNAME": role,
                "LLMQ_REDIS_PASSWORD_FILE": str(secrets.password_file(role)),
                "LLMQ_REDIS_SSL_CAFILE": str(secrets.ca),
            }
        return env

    def settings(self, role: str = security.ROLE_ADMIN) -> Settings:
        """The settings ``role``'s processes read: this environment, with :meth:`env` over it."""
        return Settings.from_environ({**os.environ, **self.env(role)})

    def kafka_acls(self) -> list[security.KafkaAcl]:
        """The ACLs of this stack's secure cluster: :func:`security.kafka_acls` of its reply prefixes, ingress
        principals (each reading the reply topics its ``LLMQ_KAFKA_INGRESS`` grant names, if any) and peers."""
        grants = self.settings().kafka.ingress
        return security.kafka_acls(
            self.reply_topic_prefixes,
            self.ingress_principals,
            self.peer_regions,
            security.ingress_reply_prefixes(grants),
        )


REGION_REDIS_OFFSET = 5
REGION_API_OFFSET = 10


def _python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def redis_server_argv(
    port: int, state_dir: Path, maxmemory_bytes: int, policy: str = MEMORY_POLICY, listen: list[str] | None = None
) -> list[str]:
    """redis-server as a local stack runs it: on 127.0.0.1, without persistence, its memory bounded under ``policy``.
    ``listen``: its port arguments instead of a plaintext ``--port`` (secure mode: TLS only, ACL users)."""
    return [
        "redis-server",
        *(listen if listen is not None else ["--port", str(port)]),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(state_dir),
        "--maxmemory",
        str(maxmemory_bytes),
        "--maxmemory-policy",
        policy,
    ]


def replica_name(kind: str, index: int) -> str:
    """The process name of batcher or result-router number ``index`` (instance id ``<kind>-<index>``): ``<kind>`` for
    the first (as a one-of-each stack always named it), ``<kind>-<index>`` for the others."""
    return kind if index == 0 else f"{kind}-{index}"


def _replica_specs(cfg: StackConfig, kind: str, module: str, count: int, slot: int) -> list[ProcSpec]:
    """``count`` processes of a consumer-group service (batcher, result-router), instance ids ``<kind>-0``... The first
    is named ``<kind>`` with its /metrics port at ``slot`` past the base (where one-of-each stacks always had it);
    the others ``<kind>-<i>``, their ports after the API pods', batchers and routers alternating, so the ports of
    those already running stay put when a stack grows (:meth:`StackConfig.replica_metrics_port`)."""
    specs = []
    for i in range(count):
        instance = cfg.instance_id(f"{kind}-{i}")
        metrics_port = cfg.replica_metrics_port(i, slot)
        specs.append(
            ProcSpec(
                name=replica_name(kind, i),
                kind=kind,
                marker=module,
                argv=_python_module(module, "--instance-id", instance, "--metrics-port", str(metrics_port)),
                alive=constants.alive_key(kind, instance),
                metrics_port=metrics_port,
            )
        )
    return specs


def service_specs(cfg: StackConfig) -> list[ProcSpec]:
    """The llmq services of the stack (Kafka and Redis excluded), in start order."""
    base = cfg.metrics_base_port
    specs = [
        *_replica_specs(cfg, "result-router", "llmq_result_router.main", cfg.routers, 0),
        *_replica_specs(cfg, "batcher", "llmq_batcher.main", cfg.batchers, 1),
    ]
    partition = 0
    for model, engine, count, extra in (
        ("llmq-tiny", "transformers", cfg.tiny_workers, []),
        (
            "llmq-sim",
            "simulated",
            cfg.sim_workers,
            [
                "--batch-time-ms",
                str(cfg.sim_batch_time_ms),
                "--max-batch-size",
                str(cfg.sim_max_batch_size),
                *cfg.sim_worker_args,
            ],
        ),
        (SMOLLM2_135M_INSTRUCT.name, "transformers", cfg.smollm2_workers, []),
    ):
        for i in range(count):
            name = f"{model.removeprefix('llmq-')}-{i}"
            worker_id = cfg.instance_id(name)
            metrics_port = base and base + 2 + partition
            specs.append(
                ProcSpec(
                    name=f"worker-{name}",
                    kind="worker",
                    marker="llmq_worker.main",
                    model=model,
                    argv=_python_module(
                        "llmq_worker.main",
                        "--worker-id",
                        worker_id,
                        "--partition",
                        str(partition),
                        "--model",
                        model,
                        "--engine",
                        engine,
                        *extra,
                        "--metrics-port",
                        str(metrics_port),
                    ),
                    alive=constants.alive_key("worker", worker_id),
                    metrics_port=metrics_port,
                )
            )
            partition += 1
    for i, port in enumerate(cfg.api_ports):
        metrics_port = base + 2 + partition + i
        specs.append(
            ProcSpec(
                name=f"api-{i}",
                kind="api",
                marker="llmq_api.main",
                port=port,
                argv=_python_module(
                    "llmq_api.main",
                    *("--host", "127.0.0.1", "--port", str(port), "--instance-id", cfg.instance_id(f"api-{i}")),
                    *("--metrics-port", str(metrics_port)),
                ),
                metrics_port=metrics_port,
            )
        )
    return specs


class DevStack:
    """Starts, inspects and stops one local stack described by a :class:`StackConfig`."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.state = cfg.state_dir.resolve()
        self.pids = self.state / "pids"
        self.logs = self.state / "logs"

    # --- start ---------------------------------------------------------------------------------------------------

    def up(self, timeout_s: float = 180.0, log=print, services: bool = True) -> None:
        """Start every process that is not running yet and wait until all are healthy. Raises RuntimeError otherwise.

        ``services=False`` starts only Kafka and Redis (what the test suite needs under its own services).
        """
        for folder in (self.state, self.pids, self.logs):  # private: logs name tenants, the file store holds their data
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        if self.cfg.manage_infra:
            if self.cfg.secure:
                self.cfg.secrets.ensure(self.cfg.ingress_principals)
            self._start_redis()
            self._start_kafka()
        admin = self.cfg.settings()
        _wait(lambda: _redis_ping(admin), deadline, "redis")
        _wait(lambda: kafka_dist.tcp_open(self.cfg.kafka_port), deadline, "kafka")
        _wait(lambda: _try(lambda: _run_in_thread(self._prepare_kafka(admin))), deadline, "kafka topics")
        for spec in service_specs(self.cfg) if services else ():
            self._spawn(spec)
        for row in self._wait_healthy(deadline):
            log(f"  {row['name']:<18} pid {row['pid']:<8} {row['health']}")

    async def _prepare_kafka(self, admin: Settings) -> None:
        """As the admin: the ACLs of every role (secure mode) and the llmq topics."""
        if self.cfg.secure and self.cfg.manage_infra:
            await security.apply_kafka_acls(admin, self.cfg.kafka_acls())
        await ensure_topics(admin, raise_limits=True)

    def _redis_tls_args(self) -> list[str]:
        """Secure mode: TLS only (no plaintext port) and the ACL users of :func:`security.redis_acl_file`."""
        secrets = self.cfg.secrets
        acl_file = secrets.folder / "redis.acl"
        passwords = {role: secrets.password(role) for role in security.ROLES}
        acl_file.write_text(security.redis_acl_file(passwords))
        acl_file.chmod(0o600)
        return [
            "--port", "0", "--tls-port", str(self.cfg.redis_port), "--tls-cert-file", str(secrets.cert("redis")),
            "--tls-key-file", str(secrets.key("redis")), "--tls-ca-cert-file", str(secrets.ca),
            "--tls-auth-clients", "optional", "--aclfile", str(acl_file),
        ]  # fmt: skip

    def _start_redis(self) -> None:
        listen = self._redis_tls_args() if self.cfg.secure else None
        spec = ProcSpec(
            name="redis",
            kind="redis",
            marker="redis-server",
            port=self.cfg.redis_port,
            argv=redis_server_argv(self.cfg.redis_port, self.state, self.cfg.redis_maxmemory_bytes, listen=listen),
        )
        self._spawn(spec)

    def _start_kafka(self) -> None:
        if self._running_pid("kafka"):
            return
        libs = kafka_dist.ensure_installed()
        data = self.state / "kafka-data"
        config = self.state / "kafka.properties"
        scram_users = None
        if self.cfg.secure:
            secrets = self.cfg.secrets
            tls = {"keystore": str(secrets.broker_keystore), "ca": str(secrets.ca)}
            super_users = [security.ROLE_ADMIN, security.KAFKA_BROKER_PRINCIPAL]
            properties = kafka_dist.secure_server_properties(
                data, self.cfg.kafka_port, self.cfg.kafka_port + 1, self.cfg.kafka_tls_port, tls, super_users
            )
            principals = (*security.ROLES, *self.cfg.ingress_principals)
            scram_users = {p: secrets.password(p) for p in principals}
        else:
            properties = kafka_dist.server_properties(data, self.cfg.kafka_port, self.cfg.kafka_port + 1)
        config.write_text(properties)
        config.chmod(0o600)
        log4j = self.state / "kafka-log4j2.yaml"
        log4j.write_text(kafka_dist.LOG4J2_YAML)
        kafka_dist.format_storage(libs, config, data, scram_users)
        argv = kafka_dist.java_command(libs, f"-Dlog4j2.configurationFile={log4j}", "kafka.Kafka", str(config))
        self._spawn(ProcSpec(name="kafka", kind="kafka", marker="kafka.Kafka", argv=argv, port=self.cfg.kafka_port))

    def mirror(self, source: StackConfig, options: mirror.MirrorOptions = mirror.MirrorOptions()) -> None:
        """Start MirrorMaker 2 in this (the target) region for the flow ``source`` -> this region, unless it runs:
        its properties (both flows, :func:`mirror.mirror_properties`) and log in this stack's state dir, its pid file
        with this region's processes (``down`` and :meth:`kill` stop it with them)."""
        libs = kafka_dist.ensure_mirror_installed()
        properties = self.state / f"mirror-{source.region}.properties"
        clusters = (self._mirror_cluster(source), self._mirror_cluster(self.cfg))
        properties.write_text(mirror.mirror_properties(*clusters, options))
        properties.chmod(0o600)
        log4j = self.state / "mirror-log4j2.properties"
        log4j.write_text(kafka_dist.MIRROR_LOG4J2_PROPERTIES)
        argv = mirror.mirror_argv(libs, properties, log4j, self.cfg.region)
        self._spawn(ProcSpec(name=f"mirror-{source.region}", kind="mirror", marker=mirror.MAIN_CLASS, argv=argv))

    @staticmethod
    def _mirror_cluster(cfg: StackConfig) -> mirror.MirrorCluster:
        if not cfg.secure:
            return mirror.MirrorCluster(cfg.region, cfg.kafka_bootstrap)
        secrets = cfg.secrets
        return mirror.MirrorCluster(cfg.region, cfg.kafka_bootstrap, secrets.password(security.ROLE_MM2), secrets.ca)

    def _spawn(self, spec: ProcSpec) -> None:
        if self._running_pid(spec.name):
            return
        if (earlier := self._record(spec.name)) is not None:  # killed and still exiting: its ports are not free yet
            _wait_gone(earlier["pid"], earlier["marker"], 10)
        env = {
            "LLMQ_FILES_URL": str(self.state / "files"),  # batch files stay in the state folder unless set
            **os.environ,
            **self.cfg.env(security.SERVICE_ROLES.get(spec.kind, security.ROLE_ADMIN)),
            "PYTHONUNBUFFERED": "1",
            **self.cfg.extra_env,
        }
        with open(self.logs / f"{spec.name}.log", "ab") as log_file:
            proc = subprocess.Popen(
                spec.argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        record = {
            "pid": proc.pid,
            "kind": spec.kind,
            "model": spec.model,
            "port": spec.port,
            "alive": spec.alive,
            "marker": spec.marker,
            "started": time.time(),
            "metrics_port": spec.metrics_port,
        }
        (self.pids / f"{spec.name}.json").write_text(json.dumps(record))

    def _wait_healthy(self, deadline: float) -> list[dict]:
        while True:
            rows = self.status()
            if all(row["health"] == "healthy" for row in rows):
                return rows
            dead = [row for row in rows if row["health"] == "exited"]
            if dead or time.monotonic() > deadline:
                bad = dead or [row for row in rows if row["health"] != "healthy"]
                causes = "".join(f"\n  {row['name']}: {last_error(Path(row['log']))}" for row in bad)
                raise RuntimeError(f"not healthy: {', '.join(row['name'] for row in bad)}{causes}\nlogs in {self.logs}")
            time.sleep(0.5)

    # --- inspect -------------------------------------------------------------------------------------------------

    def _records(self) -> list[tuple[str, dict]]:
        if not self.pids.exists():
            return []
        return [(path.stem, json.loads(path.read_text())) for path in sorted(self.pids.glob("*.json"))]

    def _record(self, name: str) -> dict | None:
        path = self.pids / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _running_pid(self, name: str) -> int | None:
        record = self._record(name)
        return record["pid"] if record is not None and _is_ours(record["pid"], record["marker"]) else None

    def status(self) -> list[dict]:
        """One row per process started here: name, kind, model, pid, port, metrics_port, health (healthy | starting |
        exited). ``port`` is the one the process listens on: Kafka's, Redis', an API pod's, else its /metrics port."""
        client = _sync_redis(self.cfg.settings())
        rows = []
        for name, record in self._records():
            health = "exited"
            if _is_ours(record["pid"], record["marker"]):
                health = "healthy" if _healthy(record, self.cfg, client) else "starting"
            metrics_port = _metrics_port(record)
            rows.append(
                {
                    "name": name,
                    "kind": record["kind"],
                    "model": record["model"],
                    "pid": record["pid"],
                    "port": record["port"] or metrics_port,
                    "metrics_port": metrics_port,
                    "health": health,
                    "log": str(self.logs / f"{name}.log"),
                }
            )
        return rows

    def metrics_urls(self) -> dict[str, str]:
        """Process name -> Prometheus /metrics URL, for each llmq service started here."""
        urls = {}
        for name, record in self._records():
            port = _metrics_port(record)
            if port:
                urls[name] = f"http://127.0.0.1:{port}/metrics"
        return urls

    # --- stop ----------------------------------------------------------------------------------------------------

    def down(self, timeout_s: float = 20.0, services_only: bool = False) -> list[str]:
        """SIGTERM every process started here; SIGKILL what outlives the bound. The API pods go first and drain what
        they hold while the rest still runs; then the other services together (no order among them matters once no
        pod takes requests, and each takes about a second to exit: the services of a stack with two pods and three
        workers stopped in 2.2-2.4 s instead of 4.4-4.8 s one kind after another), then Kafka, then Redis.

        ``services_only`` leaves Kafka and Redis running.
        """
        order = {"api": 0, "batcher": 1, "worker": 1, "result-router": 1, "mirror": 1, "kafka": 2, "redis": 3}
        stopped = []
        records = sorted(self._records(), key=lambda item: order.get(item[1]["kind"], 9))
        if services_only or not self.cfg.manage_infra:
            records = [(name, r) for name, r in records if r["kind"] not in ("kafka", "redis")]
        for group in sorted({order.get(r["kind"], 9) for _, r in records}):
            members = [(n, r) for n, r in records if order.get(r["kind"], 9) == group]
            for _name, record in members:
                if _is_ours(record["pid"], record["marker"]):
                    os.killpg(record["pid"], signal.SIGTERM)
            for name, record in members:
                _wait_gone(record["pid"], record["marker"], timeout_s)
                (self.pids / f"{name}.json").unlink(missing_ok=True)
                stopped.append(name)
        return stopped

    def kill(self) -> list[str]:
        """SIGKILL every process started here at once (the loss of a whole region: Kafka, Redis, services, the
        MirrorMaker 2 into it), and wait until they are gone. Their state (Kafka's data) stays on disk."""
        records = [(name, r) for name, r in self._records() if _is_ours(r["pid"], r["marker"])]
        for _name, record in records:
            os.killpg(record["pid"], signal.SIGKILL)
        for name, record in records:
            _wait_gone(record["pid"], record["marker"], 10)
            (self.pids / f"{name}.json").unlink(missing_ok=True)
        return [name for name, _ in records]


# --- helpers -----------------------------------------------------------------------------------------------------


PF_EXITING = 0x4  # /proc/<pid>/stat flags (include/linux/sched.h): the process has begun to exit


def _is_ours(pid: int, marker: str) -> bool:
    """``pid`` runs and is the process started with ``marker``: not a zombie, and not exiting (a kill -9 of a
    process with gigabytes mapped, a worker, takes hundreds of ms to tear down; it must not pass for running, or an
    ``up`` right after the kill would leave it dead)."""
    found = _proc(pid, marker)
    return found is not None and found[0] != "Z" and not found[1] & PF_EXITING


def _present(pid: int, marker: str) -> bool:
    """``pid`` (started with ``marker``) has not finished exiting: it may still hold its ports and files."""
    found = _proc(pid, marker)
    return found is not None and found[0] != "Z"


def _proc(pid: int, marker: str) -> tuple[str, int] | None:
    """The state letter and flags of ``pid`` from /proc, or None when it is gone or another program."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    # An empty command line is a child between fork and exec, or a process whose memory is being released: ours.
    if cmdline and marker not in cmdline:
        return None
    return fields[0], int(fields[6])


LOG_TAIL_BYTES = 64 * 1024  # of a log, read for its last error


def last_error(log: Path) -> str:
    """The last error a process logged: the message of its last JSON line of level ERROR or CRITICAL, or its last
    line that is not JSON (a traceback ends with the exception); says so when the log has neither."""
    try:
        with log.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        return f"no log at {log}"
    for line in reversed([line.strip() for line in lines if line.strip()]):
        try:
            entry = json.loads(line)
        except ValueError:
            return line
        if isinstance(entry, dict) and entry.get("level") in ("ERROR", "CRITICAL"):
            return str(entry.get("msg", line))
    return f"no error logged (see {log})"


def _metrics_port(record: dict) -> int:
    """Where a process serves Prometheus /metrics (its own port, never an API port); Kafka and Redis nowhere (0)."""
    return 0 if record["kind"] in ("kafka", "redis", "mirror") else record.get("metrics_port", 0)


def _wait_gone(pid: int, marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _present(pid, marker):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.1)


def _healthy(record: dict, cfg: StackConfig, client: redis_sync.Redis) -> bool:
    kind = record["kind"]
    if kind == "redis":
        return _redis_ping(cfg.settings())
    if kind == "kafka":
        return kafka_dist.tcp_open(record["port"])
    if kind == "mirror":  # nothing to ask it: it is up while it runs (the multi-region tests watch it replicate)
        return True
    if kind == "api":
        return _try(lambda: httpx.get(f"http://127.0.0.1:{record['port']}/readyz", timeout=1).status_code == 200)
    return _try(lambda: bool(client.exists(record["alive"])))


def _sync_redis(settings: Settings) -> redis_sync.Redis:
    return redis_sync.Redis.from_url(settings.redis.url, socket_timeout=1, **connection_options(settings))


def _redis_ping(settings: Settings) -> bool:
    return _try(lambda: _sync_redis(settings).ping())


def _run_in_thread(coro) -> bool:
    """Run a coroutine to completion on a fresh event loop in another thread (safe under a caller's running loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()
    return True


def _try(check) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _wait(check, deadline: float, what: str) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in time")
        time.sleep(0.3)

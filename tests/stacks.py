"""Private stacks of llmq services on the test suite's own Kafka broker and Redis (``infra`` in tests/conftest.py), two
whole regions with MirrorMaker 2 both ways (:func:`two_regions`), and what the integration tests drive them with:
workers in-process and as processes, batches, kcat and ``llmq bench``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmq_cli import mirror
from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.main import app
from llmq_core import constants, kafka, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.names import Names
from llmq_core.security import ROLE_ADMIN
from llmq_core.settings import Settings
from llmq_worker.engines.simulated import SimulatedEngine
from llmq_worker.loop import WorkerLoop
from llmq_worker.prefix_cache import PrefixLedger
from tests import ports


@contextlib.contextmanager
def private_stack(infra: DevStack | None, timeout_s: float = 240, **config) -> Iterator[DevStack]:
    """The services of a DevStack whose StackConfig is ``infra``'s with ``config`` replaced, up for the ``with`` block
    (the suite's broker and Redis stay up). Skips when the suite runs on Kafka/Redis named by the environment."""
    if infra is None:
        pytest.skip("needs the suite's own Kafka/Redis (LLMQ_KAFKA_BOOTSTRAP_SERVERS is set)")
    with _up(DevStack(dataclasses.replace(infra.cfg, **config)), timeout_s, own_infra=False) as running:
        yield running


@contextlib.contextmanager
def standalone_stack(infra: DevStack | None, own: dict, subdir: str = "", **config) -> Iterator[DevStack]:
    """A :func:`private_stack` that does not skip when the suite runs on Kafka/Redis the environment names (``infra``
    is None): it brings up a broker and Redis of its own instead (``own``: their state_dir and ports), removed after.
    ``subdir``: where under the suite's state dir its services keep their state."""
    if infra is None:
        cfg = StackConfig(**own, **config)
    else:
        cfg = dataclasses.replace(infra.cfg, state_dir=infra.cfg.state_dir / subdir, manage_infra=False, **config)
    with _up(DevStack(cfg), 240, own_infra=infra is None) as running:
        yield running


@contextlib.contextmanager
def _up(stack: DevStack, timeout_s: float, *, own_infra: bool) -> Iterator[DevStack]:
    """``stack`` up for the ``with`` block; then its services down (``own_infra``: its broker and Redis too, and its
    state dir removed)."""
    try:
        stack.up(timeout_s=timeout_s, log=lambda *_: None)
        yield stack
    finally:
        stack.down(services_only=not own_infra)
        if own_infra:
            shutil.rmtree(stack.cfg.state_dir, ignore_errors=True)


@contextlib.contextmanager
def sim_stack(
    infra: DevStack | None, api_ports: tuple[int, ...], *, batch_time_ms: int, sim_workers: int = 1, **config
) -> Iterator[DevStack]:
    """A :func:`private_stack` whose workers are all llmq-sim (``sim_workers`` of them, ``batch_time_ms`` a batch),
    its API pods on ``api_ports``; ``config``: the rest of its StackConfig."""
    with private_stack(
        infra, api_ports=api_ports, tiny_workers=0, sim_workers=sim_workers, sim_batch_time_ms=batch_time_ms, **config
    ) as running:
        yield running


# Two regions side by side (StackConfig.for_region: each takes ports base..base+40), away from the suite's other ports
REGION_NAMES = ("a", "b")
REGION_PORT_BASES = (ports.block(), ports.block())


@dataclasses.dataclass
class Regions:
    """Two regions' stacks (``a``, ``b``), each with MirrorMaker 2 running in it for the flow from the other."""

    a: DevStack
    b: DevStack
    options: mirror.MirrorOptions
    services: bool = True

    def peer(self, stack: DevStack) -> DevStack:
        return self.b if stack is self.a else self.a

    def kill(self, stack: DevStack) -> list[str]:
        """The loss of ``stack``'s region: SIGKILL every process of it at once (Kafka, Redis, services, and the
        MirrorMaker 2 that copies the peer's topics into it). Returns their names."""
        return stack.kill()

    def revive(self, stack: DevStack, timeout_s: float = 240) -> None:
        """Bring a killed region back: its Kafka on the data it had (Redis comes back empty: it keeps nothing), its
        services, and its inbound MirrorMaker 2."""
        stack.up(timeout_s=timeout_s, log=lambda *_: None, services=self.services)
        stack.mirror(self.peer(stack).cfg, self.options)


@contextlib.contextmanager
def two_regions(
    state_dir: Path,
    *,
    services: bool = True,
    options: mirror.MirrorOptions = mirror.MirrorOptions(intervals_s=dict(mirror.TEST_INTERVALS_S)),
    timeout_s: float = 300,
    port_bases: tuple[int, int] = REGION_PORT_BASES,
    **config,
) -> Iterator[Regions]:
    """Regions ``a`` and ``b`` (:data:`REGION_NAMES`) as whole stacks on this machine, each on its own Kafka, Redis
    and ports (``port_bases``; ``services=False``: Kafka and Redis only), with MirrorMaker 2 both ways
    under the test intervals (:data:`mirror.TEST_INTERVALS_S`); ``config``: the rest of both StackConfigs. Up for the
    ``with`` block, then every process SIGKILLed and ``state_dir`` removed. MirrorMaker 2 takes tens of seconds to copy a
    topic created after it started: wait for what you need (``wait_for_topic``)."""
    stacks = [
        DevStack(StackConfig.for_region(name, base, state_dir, peer_regions=(peer,), **config))
        for name, base, peer in zip(REGION_NAMES, port_bases, REGION_NAMES[::-1], strict=True)
    ]
    for stack in stacks:  # what an interrupted run left behind, then fresh clusters: no topic or offset of it
        stack.down()
    shutil.rmtree(state_dir, ignore_errors=True)
    regions = Regions(*stacks, options=options, services=services)
    try:
        for stack in stacks:
            stack.up(timeout_s=timeout_s, log=lambda *_: None, services=services)
        for stack in stacks:
            stack.mirror(regions.peer(stack).cfg, options)
        yield regions
    finally:
        for stack in stacks:  # at once: their state is removed next, so nothing needs a graceful stop
            stack.kill()
        shutil.rmtree(state_dir, ignore_errors=True)


async def wait_for_topic(settings: Settings, topic: str, timeout_s: float = 120) -> float:
    """Seconds until ``topic`` exists on ``settings``' cluster (polled; TimeoutError past ``timeout_s``)."""
    admin = kafka.make_admin(settings)
    await admin.start()
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(timeout_s):
            while topic not in await admin.list_topics():
                await asyncio.sleep(0.5)
    finally:
        await admin.close()
    return asyncio.get_running_loop().time() - started


# A rate-limit check lets a request through when Redis answers slower than its timeout (fail open, 250 ms by default);
# tests that check limits and their accounting give it this long, so a loaded machine's stall is not read as "no limit".
RATE_LIMIT_TIMEOUT_MS = 30_000


def shed_wait_env(shed_wait_ms: dict[str, int]) -> dict[str, str]:
    """The API pods' environment that sets their shed wait per priority class."""
    return {"LLMQ_API_SHED_WAIT_MS": json.dumps(shed_wait_ms)}


@contextlib.asynccontextmanager
async def simulated_worker(
    worker_id: str,
    partition: int,
    model: str,
    *,
    batch_time_ms: int,
    names: Names = Names(),
    prefix_ledger: PrefixLedger | None = None,
    **clients,
) -> AsyncIterator[asyncio.Task]:
    """A worker loop in-process on the simulated engine (8 per batch), heartbeating every 100 ms (and publishing its
    ``prefix_ledger``, if one, as often), running for the ``async with`` block: yields its task. ``clients``: its
    ``consumer``, ``producer`` and ``redis``. Stopped after, and its engine closed."""
    engine = SimulatedEngine(max_batch_size=8, batch_time_ms=batch_time_ms, prefix_ledger=prefix_ledger)
    async with engine_worker(engine, worker_id, partition, model, names=names, **clients) as task:
        yield task


@contextlib.asynccontextmanager
async def engine_worker(
    engine, worker_id: str, partition: int, model: str, *, names: Names = Names(), **clients
) -> AsyncIterator[asyncio.Task]:
    """A worker loop in-process on ``engine``, heartbeating every 100 ms, as :func:`simulated_worker`."""
    settings = Settings(
        worker={"heartbeat_interval_ms": 100, "prefix_summary_interval_ms": 100}, runtime={"shutdown_grace_s": 5}
    )
    loop = WorkerLoop.build(
        engine,
        settings=settings,
        worker_id=worker_id,
        partition=partition,
        model=model,
        max_pending=32,
        names=names,
        **clients,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # drains for up to shutdown_grace_s, on a loaded machine
        await engine.close()


async def send_batch(producer, batch_id: str, worker_id: str, partition: int, *requests: wire.GenerationRequest):
    """A Batch of ``requests`` (of one model) for ``worker_id``, formed now, produced to ``partition`` of
    llmq.batches; the record's metadata."""
    batch = wire.Batch(
        batch_id=batch_id,
        worker_id=worker_id,
        model=requests[0].model,
        requests=list(requests),
        formed_ms=SYSTEM_CLOCK.now_ms(),
        flush_reason="size",
    )
    return await kafka.send_message(producer, constants.TOPIC_BATCHES, batch, key=batch_id, partition=partition)


def kcat_connection(stack: DevStack) -> list[str]:
    """kcat's broker arguments for ``stack``. Secure: the admin principal over mTLS (its certificate, CN=admin), as
    Debian's librdkafka 2.0 fails SCRAM against Kafka 4.x brokers (edenhill/kcat#462, fixed in librdkafka 2.6.1)."""
    if not stack.cfg.secure:
        return ["-b", stack.cfg.kafka_bootstrap]
    secrets = stack.cfg.secrets
    return [
        *("-b", f"127.0.0.1:{stack.cfg.kafka_tls_port}", "-X", "security.protocol=SSL"),
        *("-X", f"ssl.ca.location={secrets.ca}", "-X", f"ssl.certificate.location={secrets.cert(ROLE_ADMIN)}"),
        *("-X", f"ssl.key.location={secrets.key(ROLE_ADMIN)}"),
    ]


async def kcat_request(stack: DevStack, topic: str, request: dict) -> dict:
    """``request``, a GenerationRequest as JSON answered on a Kafka reply topic, produced to ``topic`` by kcat as a
    non-Python client would (its reply topic created first, by the admin: the broker does not auto-create topics); the
    first result kcat then reads from that reply topic, decoded."""
    reply_topic = request["reply_to"]["topic"]
    await kafka.create_topic(stack.cfg.settings(), reply_topic)
    connection = kcat_connection(stack)
    produce = [
        "kcat",
        "-P",
        *connection,
        "-t",
        topic,
        "-k",
        request["request_id"],
        "-H",
        "content-type=application/json",
    ]
    subprocess.run(produce, input=json.dumps(request).encode(), check=True, timeout=30)
    consume = ["kcat", "-C", *connection, "-t", reply_topic, "-o", "beginning", "-c", "1"]
    consumed = await asyncio.to_thread(subprocess.run, consume, capture_output=True, check=True, timeout=90)
    return json.loads(consumed.stdout.decode().splitlines()[0])


def run_bench(stack: DevStack, prompts_dir: Path, **options: object) -> dict:
    """``llmq bench --json`` against every API pod of ``stack`` on ten short code prompts (written to ``prompts_dir``)
    with ``options`` (``duration_s=3``: ``--duration-s 3``): its report, once it has exited 0."""
    prompts = prompts_dir / "prompts.jsonl"
    lines = (json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):\n    return", "max_tokens": 8}) for i in range(10))
    prompts.write_text("".join(line + "\n" for line in lines))
    args = ["bench", "--json", "--prompts", str(prompts), "--redis-url", stack.cfg.redis_url]
    for name, value in options.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    for port in stack.cfg.api_ports:
        args += ["--base-url", f"http://127.0.0.1:{port}/v1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


async def worker_process(
    settings: Settings,
    worker_id: str,
    partition: int,
    model: str,
    *options: str,
    env: dict[str, str] | None = None,
    **popen,
) -> asyncio.subprocess.Process:
    """``python -m llmq_worker.main`` on the simulated engine and ``settings``' Kafka and Redis; ``options``: the rest
    of its command line, ``env``: more of its environment, ``popen``: of ``asyncio.create_subprocess_exec`` (stdout,
    stderr)."""
    env = {
        **os.environ,
        "LLMQ_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "LLMQ_REDIS_URL": settings.redis.url,
        **(env or {}),
    }
    command = ["--worker-id", worker_id, "--partition", str(partition), "--model", model, "--engine", "simulated"]
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmq_worker.main", *command, *options, env=env, **popen
    )


async def reap(*processes: asyncio.subprocess.Process) -> None:
    """At a test's end: SIGKILL whichever of ``processes`` still runs and wait for it (no orphan outlives the test)."""
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()

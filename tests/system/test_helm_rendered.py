"""The chart's rendered containers run as local processes against the suite's real Kafka and Redis: the commands,
arguments and environment `helm template` renders (the settings ConfigMap plus each container's env, `$(VAR)`
expanded as the kubelet does, the pod's name as HOSTNAME) start services that do their job, and SIGTERM ends each
within the pod's terminationGracePeriodSeconds. Only the connection values are local (PLAINTEXT, no Secrets)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from redis.asyncio import Redis

from llmq_core import constants, ids, wire
from tests.helm_chart import needs_helm, objects
from tests.stacks import reap

pytestmark = [pytest.mark.integration, needs_helm]

OFFSET, ORDINAL = 13, 2  # the worker pod owns partition 15 of llmq.batches: no other test's worker reads it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def local_release(settings, tmp_path) -> list[dict]:
    """The chart rendered for the suite's Kafka and Redis, with one simulated worker model."""
    values = {
        "kafka": {"bootstrapServers": settings.kafka.bootstrap_servers, "securityProtocol": "PLAINTEXT"},
        "redis": {"url": settings.redis.url, "credentialsSecret": "", "caSecret": ""},
        "apiKeysSecret": "",
        "files": {"url": str(tmp_path / "files")},
        "metricsPort": free_port(),
        "api": {"port": free_port()},
        "workers": {
            "models": [
                {"name": "sim", "model": "llmq-sim", "engine": "simulated", "args": ["--batch-time-ms", "100"]}
                | {"partitionOffset": OFFSET, "minReplicas": 0, "maxReplicas": ORDINAL + 1}
            ]
        },
    }
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(values))
    return objects(path, sets=("kafka.credentialsSecret=", "kafka.caSecret=", "kafka.topicReplicationFactor=1"))


def pod_of(release: list[dict], kind: str, suffix: str) -> dict:
    """The pod spec of the workload ``kind`` whose name ends in ``suffix``."""
    (workload,) = [o for o in release if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return workload["spec"]["template"]["spec"]


async def start(release: list[dict], kind: str, suffix: str, pod_name: str) -> tuple[asyncio.subprocess.Process, int]:
    """The workload's one container as a process named ``pod_name``; returns it and the pod's termination grace."""
    pod = pod_of(release, kind, suffix)
    (container,) = pod["containers"]
    (config,) = [o for o in release if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-settings")]
    env = dict(config["data"]) if container.get("envFrom") else {}
    for item in container.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else pod_name  # fieldRef: metadata.name
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], arg) for arg in container["command"]]
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `python` and `llmq` of this venv
    process = await asyncio.create_subprocess_exec(
        *command, env={**inherited, **env, "HOSTNAME": pod_name, "PATH": path}
    )
    return process, pod.get("terminationGracePeriodSeconds", 30)


async def stops_within(process: asyncio.subprocess.Process, grace_s: int) -> float:
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    await asyncio.wait_for(process.wait(), grace_s)
    return time.monotonic() - began


async def test_the_topics_hook_runs_llmq_topics(local_release):
    process, _ = await start(local_release, "Job", "-topics", "llmq-topics-x")
    assert await asyncio.wait_for(process.wait(), 120) == 0


async def test_a_worker_pod_heartbeats_on_offset_plus_ordinal_and_drains_on_sigterm(local_release, settings):
    pod_name = f"llmq-worker-sim-{ORDINAL}"
    worker_id = ids.instance_id("local", pod_name)  # the pod's name in the chart's default region
    redis = Redis.from_url(settings.redis.url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(constants.REDIS_HEARTBEATS_CHANNEL)
    process, grace_s = await start(local_release, "StatefulSet", "-worker-sim", pod_name)
    try:
        deadline = time.monotonic() + 60
        beat = None
        while beat is None and time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            decoded = wire.decode(message["data"]) if message else None
            if isinstance(decoded, wire.WorkerHeartbeat) and decoded.worker_id == worker_id:
                beat = decoded
        assert beat is not None, "no heartbeat from the rendered worker within 60 s"
        assert (beat.partition, beat.model) == (OFFSET + ORDINAL, "llmq-sim")
        await stops_within(process, grace_s)
        assert process.returncode == 0
    finally:
        await reap(process)
        await pubsub.aclose()
        await redis.aclose()


async def test_an_api_pod_answers_its_probes_and_drains_on_sigterm(local_release):
    pod = pod_of(local_release, "Deployment", "-api")
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    process, grace_s = await start(local_release, "Deployment", "-api", "llmq-api-abc12-xyz")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['http']}") as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    ready = await client.get(container["readinessProbe"]["httpGet"]["path"])
                    if ready.status_code == 200 or time.monotonic() > deadline:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the rendered API pod never listened"
                await asyncio.sleep(0.2)
            assert ready.status_code == 200, ready.text
            live = await client.get(container["livenessProbe"]["httpGet"]["path"])
            assert live.json() == {"status": "ok"}
            metrics = await client.get(f"http://127.0.0.1:{ports['metrics']}/metrics")
            assert "llmq_api_in_flight" in metrics.text  # what the API ScaledObject's query reads
        await stops_within(process, grace_s)
    finally:
        await reap(process)

"""An API pod whose Kafka broker dies and comes back: the circuit breaker, degraded readiness, /dependencies, and
recovery without a restart (the pod's own check closes the breaker, with no request sent).

The broker is a private one this test starts (DevStack's Kafka on free ports, its own data directory), so killing it
touches nobody else's; Redis is the suite's. A fake worker (test_api.FakeWorker) answers what the pod produces.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid

import httpx
import pytest

from llmq_api.pod import Pod
from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.kafka_dist import tcp_open
from llmq_core.kafka import ensure_topics
from llmq_core.names import Names
from llmq_core.settings import Settings
from tests.inprocess.test_api import DEV, MODEL, FakeWorker, heartbeat, serving

pytestmark = pytest.mark.integration

BROKER_START_S = 90  # a cold JVM on a loaded 2-core machine
RECOVERY_S = 60
BACKOFF_MS = 4000  # long enough that no probe falls among the requests that must be refused at once


def free_port_pair() -> int:
    """A port p with p and p + 1 (the broker's controller) both free."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port < 65535 and not tcp_open(port + 1):
            return port
    raise RuntimeError("no free port pair")


class PrivateBroker:
    def __init__(self, state_dir) -> None:
        self.stack = DevStack(StackConfig(state_dir=state_dir, kafka_port=free_port_pair(), redis_port=0))
        for folder in (self.stack.pids, self.stack.logs):
            folder.mkdir(parents=True, exist_ok=True)

    @property
    def bootstrap(self) -> str:
        return self.stack.cfg.kafka_bootstrap

    async def start(self) -> None:
        self.stack._start_kafka()  # noqa: SLF001 - Kafka alone: the suite's Redis serves this test
        await until(lambda: tcp_open(self.stack.cfg.kafka_port), BROKER_START_S, "the private broker's port")

    def kill(self) -> None:
        os.killpg(self.stack._running_pid("kafka"), signal.SIGKILL)  # noqa: SLF001

    def stop(self) -> None:
        self.stack.down(timeout_s=10)


async def until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {timeout_s} s"
        await asyncio.sleep(0.05)


async def post(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 3})
    return response, time.monotonic() - started


async def test_kafka_outage_opens_the_breaker_reports_degraded_and_recovers_without_a_restart(tmp_path):
    broker = PrivateBroker(tmp_path / "kafka")
    try:
        await broker.start()
        settings = Settings(
            kafka={"bootstrap_servers": broker.bootstrap},
            api={"kafka_breaker_backoff_ms": BACKOFF_MS, "kafka_breaker_max_backoff_ms": BACKOFF_MS},
        )
        await ensure_topics(settings)
        instance_id = f"api-outage-{uuid.uuid4().hex[:6]}"
        pod = Pod(settings, instance_id, names=Names(saturation_key=f"apitest-saturation-{instance_id}"))
        pod.catalog.observe(heartbeat(MODEL))
        worker = FakeWorker(settings, instance_id)
        await worker.start()
        try:
            async with (
                serving(pod) as base_url,
                httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client,
            ):
                response, _ = await post(client)
                assert response.status_code == 200 and response.json()["choices"][0]["text"] == "abc"
                assert (await client.get("/dependencies")).status_code == 200

                broker.kill()
                await until(lambda: not tcp_open(broker.stack.cfg.kafka_port), 10, "the broker's exit")
                first, first_s = await post(client)
                # at most the produce timeout (plus HTTP on a loaded machine); at once if the pod's check saw it first
                assert first.status_code == 503 and first_s <= settings.api.produce_timeout_ms / 1000 + 1
                for _ in range(5):  # Kafka is known to be failing: refused at once (not after the 2 s timeout)
                    later, later_s = await post(client)
                    assert later.status_code == 503 and later_s < 1, (later_s, later.text)
                    assert later.json()["error"]["code"] == "kafka_unavailable"
                    assert 1 <= int(later.headers["retry-after"]) <= BACKOFF_MS // 1000
                    assert later.headers["x-should-retry"] == "true"

                readyz = await client.get("/readyz")  # stays in the Service on purpose, but says why it is degraded
                assert readyz.status_code == 200
                assert (readyz.json()["status"], readyz.json()["failing"]) == ("degraded", ["kafka"])
                deps = await client.get("/dependencies")
                kafka = deps.json()["dependencies"]["kafka"]
                assert deps.status_code == 503 and kafka["state"] == "down" and kafka["reason"]
                assert deps.json()["dependencies"]["redis"]["state"] == "up"
                down_since_ms = kafka["since_ms"]

                await broker.start()  # no request is sent until the pod's own check has closed the breaker:
                deadline = time.monotonic() + RECOVERY_S  # an idle pod (failed over) must come back by itself
                while (deps := await client.get("/dependencies")).status_code != 200:
                    assert time.monotonic() < deadline, "the pod did not see the broker return"
                    await asyncio.sleep(0.2)
                assert deps.json()["dependencies"]["kafka"]["since_ms"] > down_since_ms
                assert (await client.get("/readyz")).json()["status"] == "ok"
                while (await post(client))[0].status_code != 200:
                    assert time.monotonic() < deadline, "requests did not succeed again after the broker returned"
                    await asyncio.sleep(0.2)
        finally:
            await worker.stop()
    finally:
        broker.stop()

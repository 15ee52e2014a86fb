"""The API pod as a real process (python -m llmq_api.main): SIGTERM while a request is held lets it finish; during the
shutdown delay the listener still answers new connections (503 + Retry-After), so none is reset."""

from __future__ import annotations

import asyncio
import signal
import uuid

import httpx
import pytest

from llmq_core import ids
from llmq_core.settings import Settings
from tests.inprocess.test_api import DEV, FakeWorker, _eventually, pod_process

pytestmark = pytest.mark.integration


async def test_sigterm_lets_in_flight_requests_finish(tmp_path):
    """The real process: SIGTERM while a request is held; it still gets its 200 and the process exits cleanly."""
    settings = Settings()
    instance_id = f"api-sigterm-{uuid.uuid4().hex[:6]}"
    worker = FakeWorker(settings, ids.instance_id(settings.region.name, instance_id))  # the process qualifies its id
    await worker.start()
    try:
        async with (
            pod_process(instance_id, tmp_path / "api.log", LLMQ_SHUTDOWN_GRACE_S="6") as (base_url, process),
            httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as client,
        ):
            call = asyncio.create_task(
                client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "slow:1500 abc", "max_tokens": 4})
            )
            await _eventually(lambda: bool(worker.seen))
            process.send_signal(signal.SIGTERM)
            response = await call
            assert response.status_code == 200 and response.json()["choices"][0]["text"] == "slow"
            assert await asyncio.to_thread(process.wait, 10) == 0
    finally:
        await worker.stop()


async def test_during_the_shutdown_delay_a_new_connection_gets_a_503_not_a_reset(tmp_path):
    """A load balancer that has not yet seen readiness turn 503 still sends connections: each is answered."""
    env = {"LLMQ_SHUTDOWN_GRACE_S": "12", "LLMQ_API_SHUTDOWN_DELAY_MS": "6000"}
    async with pod_process(f"api-delay-{uuid.uuid4().hex[:6]}", tmp_path / "api.log", **env) as (base_url, process):
        process.send_signal(signal.SIGTERM)
        await _eventually(lambda: readiness(base_url) == 503)
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=DEV) as fresh:  # connected after the signal
            response = await fresh.post("/v1/completions", json={"model": "llmq-sim", "prompt": "x", "max_tokens": 1})
            assert response.status_code == 503 and response.headers["retry-after"], response.text
            assert (await fresh.get("/healthz")).status_code == 200  # alive, only not ready
        assert await asyncio.to_thread(process.wait, 15) == 0


def readiness(base_url: str) -> int:
    return httpx.get(f"{base_url}/readyz", timeout=5).status_code

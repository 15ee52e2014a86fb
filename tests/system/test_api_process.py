"""The API pod as a real process (python -m llmq_api.main): SIGTERM while a request is held lets it finish."""

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

"""The access log (issue 16, item 7): one line per request with route, status, tenant, request id and latency; never
a prompt or an answer; off with LLMQ_API_ACCESS_LOG=false."""

from __future__ import annotations

import logging

from llmq_core.settings import Settings

SECRET_PROMPT = "my-secret-prompt"


def access_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "llmq_api.access"]


async def test_one_line_per_request_with_tenant_status_request_id_and_latency_but_no_bodies(make_app, caplog):
    client, _, _, _ = await make_app()
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": SECRET_PROMPT})
    assert response.status_code == 200
    await client.get("/v1/models", headers={"authorization": "Bearer wrong"})
    generated, refused = access_lines(caplog)
    assert generated.getMessage().startswith("POST /v1/completions 200 tenant=dev latency_ms=")
    assert generated.request_id == response.headers["x-request-id"]
    assert refused.getMessage().startswith("GET /v1/models 401 tenant=- ")
    text = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert SECRET_PROMPT not in text and response.json()["choices"][0]["text"] not in text


async def test_the_access_log_can_be_switched_off(make_app, caplog):
    client, _, _, _ = await make_app(Settings(api={"access_log": False}))
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    assert (await client.get("/healthz")).status_code == 200
    assert access_lines(caplog) == []

"""The access log (issue 16, item 7; issue 34, item 6): one record per request whose method, route template, status,
tenant, request id and latency are JSON fields of their own; never a prompt or an answer, never the request's path;
off with LLMQ_API_ACCESS_LOG=false."""

from __future__ import annotations

import json
import logging

from llmq_api.access_log import MESSAGE, NO_ROUTE
from llmq_core.settings import Settings
from llmq_core.telemetry import JsonFormatter

SECRET_PROMPT = "my-secret-prompt"
SPOOF = "x%20200%20tenant=victim%20latency_ms=1.0%0Aforged"  # decoded: "x 200 tenant=victim latency_ms=1.0\nforged"


def access_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "llmq_api.access"]


def fields(record: logging.LogRecord) -> dict:
    """The record as the services write it: one JSON line."""
    line = JsonFormatter("api").format(record)
    assert "\n" not in line
    return json.loads(line)


async def test_one_line_per_request_with_tenant_status_request_id_and_latency_but_no_bodies(make_app, caplog):
    client, _, _, _ = await make_app()
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": SECRET_PROMPT})
    assert response.status_code == 200
    await client.get("/v1/models", headers={"authorization": "Bearer wrong"})
    generated, refused = (fields(r) for r in access_lines(caplog))
    assert {k: generated[k] for k in ("msg", "method", "route", "status", "tenant", "request_id")} == {
        "msg": MESSAGE,
        "method": "POST",
        "route": "/v1/completions",
        "status": 200,
        "tenant": "dev",
        "request_id": response.headers["x-request-id"],
    }
    assert generated["latency_ms"] >= 0
    assert (refused["route"], refused["status"], refused["tenant"], refused["request_id"]) == (
        "/v1/models",
        401,
        "-",
        "-",
    )
    text = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert SECRET_PROMPT not in text and response.json()["choices"][0]["text"] not in text


async def test_a_path_that_spells_a_log_line_is_logged_as_its_route_template(make_app, caplog):
    """Issue 34 item 6: the decoded path once went into the message, where it read as another tenant's 200 and a
    forged second line."""
    client, _, _, _ = await make_app()
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    assert (await client.get(f"/v1/files/{SPOOF}")).status_code == 404
    assert (await client.get(f"/no/such/route/{SPOOF}")).status_code == 404
    (file, unmatched) = access_lines(caplog)
    assert file.getMessage() == unmatched.getMessage() == MESSAGE
    assert (file.route, file.status, file.tenant) == ("/v1/files/{file_id}", 404, "dev")
    assert (unmatched.route, unmatched.status) == (NO_ROUTE, 404)
    for record in (file, unmatched):
        line = JsonFormatter("api").format(record)
        assert "victim" not in line and "forged" not in line


async def test_a_templated_route_logs_its_template(make_app, caplog):
    client, _, _, _ = await make_app()
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    await client.get("/v1/models/some/model")
    await client.get("/v1/requests/cmpl-nope")
    assert [r.route for r in access_lines(caplog)] == ["/v1/models/{model}", "/v1/requests/{request_id}"]


async def test_the_access_log_can_be_switched_off(make_app, caplog):
    client, _, _, _ = await make_app(Settings(api={"access_log": False}))
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    assert (await client.get("/healthz")).status_code == 200
    assert access_lines(caplog) == []

"""The generation routes' short way (llmq_api.hot_routes): past Starlette's layers, with the same answers."""

import logging

import pytest

from llmq_api.hot_routes import HotRoutesApp


async def test_a_completion_takes_the_short_way_and_other_routes_the_whole_stack(setup):
    client, _, _, _ = setup
    app = client._transport.app
    assert isinstance(app, HotRoutesApp) and app.hot_stack is not None
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a", "max_tokens": 2})
    assert response.status_code == 200 and response.json()["object"] == "text_completion"
    assert app.middleware_stack is None  # built on the first request that goes through it: none did yet
    wrong_method = await client.get("/v1/completions")
    assert wrong_method.status_code == 405 and app.middleware_stack is not None


async def test_a_client_error_on_the_short_way_is_answered_by_the_apps_handler_and_logged(setup, caplog):
    client, _, _, _ = setup
    caplog.set_level(logging.INFO, logger="llmq_api.access")
    response = await client.post("/v1/chat/completions", json={"model": "llmq-sim", "messages": "not a list"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    assert response.headers["x-request-id"].startswith("chatcmpl")
    (line,) = [r for r in caplog.records if r.name == "llmq_api.access"]
    assert (line.method, line.route, line.status, line.tenant) == ("POST", "/v1/chat/completions", 400, "dev")


async def test_a_bug_on_the_short_way_is_a_500_and_is_raised_for_the_server_to_log(setup):
    client, pod, _, _ = setup

    def broken():
        raise RuntimeError("bug")

    pod.catalog.context_windows = broken
    with pytest.raises(RuntimeError, match="bug"):  # the 500 went out first (test_app checks its body)
        await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a"})

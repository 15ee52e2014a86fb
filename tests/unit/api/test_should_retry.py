"""Every error response says whether a retry can help (``x-should-retry``, which OpenAI's SDKs obey over their own
status rules): false for a passed deadline and for client mistakes, true with a Retry-After for 429 and 503."""

import httpx
import pytest

from llmq_api.connections import error_response, request_timeout, too_many_connections
from llmq_api.errors import ApiError
from llmq_api.openai_format import error_for
from llmq_core import wire
from llmq_core.settings import Settings
from tests.unit.api.fakes import final

SIM = {"model": "llmq-sim", "prompt": "abc"}


def assert_says(response: httpx.Response, retry: bool) -> None:
    assert response.headers["x-should-retry"] == ("true" if retry else "false"), response.text
    assert ("retry-after" in response.headers) == retry


@pytest.mark.parametrize(
    "request_kwargs, status",
    [
        ({"json": {"model": "llmq-sim", "prompt": ""}}, 400),
        ({"json": {**SIM, "temperature": 9}}, 400),
        ({"json": SIM, "headers": {"authorization": "Bearer nope"}}, 401),
        ({"json": SIM, "headers": {"x-llmq-class": "bulk"}}, 400),
        ({"json": {"model": "gpt-nope", "prompt": "a"}}, 404),
        ({"content": b"a=b", "headers": {"content-type": "text/plain"}}, 415),
        ({"json": {**SIM, "prompt": "a" * 5000}}, 413),
    ],
)
async def test_client_mistakes_say_do_not_retry(setup, request_kwargs, status):
    client, _, _, _ = setup
    response = await client.post("/v1/completions", **request_kwargs)
    assert response.status_code == status
    assert_says(response, retry=False)


async def test_routing_and_query_errors_say_do_not_retry(setup):
    client, _, _, _ = setup
    assert_says(await client.get("/v1/nowhere"), retry=False)  # 404 from the router
    assert_says(await client.delete("/v1/models"), retry=False)  # 405
    response = await client.get("/v1/files", params={"limit": "abc"})
    assert response.status_code == 400
    assert_says(response, retry=False)


async def test_a_passed_deadline_says_do_not_retry(setup):
    client, _, worker, _ = setup
    worker.silent = True
    response = await client.post("/v1/completions", json=SIM, headers={"x-llmq-timeout-ms": "20"})
    assert response.status_code == 504
    assert_says(response, retry=False)


async def test_overload_and_unavailability_say_retry_after(make_app):
    client, pod, _, _ = await make_app(Settings(api={"max_in_flight": 0}))
    response = await client.post("/v1/completions", json=SIM)
    assert response.status_code == 429
    assert_says(response, retry=True)
    client, pod, _, _ = await make_app()
    pod.listener.subscribed = False
    response = await client.post("/v1/completions", json=SIM)
    assert response.status_code == 503
    assert_says(response, retry=True)


async def test_an_unexpected_error_says_do_not_retry(unexpected_error):
    assert unexpected_error.status_code == 500
    assert_says(unexpected_error, retry=False)


@pytest.mark.parametrize(
    "outcome, error, status, retry",
    [
        (wire.Outcome.EXPIRED, None, 504, False),
        (wire.Outcome.CANCELED, None, 409, True),  # the system canceled it while the caller waited: a retry runs anew
        (wire.Outcome.ERRORED, wire.ErrorInfo(type="invalid_request_error", message="bad"), 400, False),
        (wire.Outcome.ERRORED, wire.ErrorInfo(type="overloaded", message="full"), 429, True),
        (wire.Outcome.ERRORED, wire.ErrorInfo(type="server_error", message="oom", retryable=True), 503, True),
        (wire.Outcome.ERRORED, wire.ErrorInfo(type="server_error", message="bug"), 500, False),
    ],
)
def test_each_worker_outcome_says_whether_to_retry(outcome, error, status, retry):
    api_error = error_for(final("r", outcome=outcome, error=error))
    headers = api_error.response_headers()
    assert api_error.status == status and headers["x-should-retry"] == ("true" if retry else "false")
    assert ("retry-after" in headers) == retry


def test_an_explicit_retry_after_is_kept():
    headers = ApiError(429, "slow down", headers={"retry-after": "7"}).response_headers()
    assert headers == {"retry-after": "7", "x-should-retry": "true"}


@pytest.mark.parametrize("error, retry", [(request_timeout("headers", 10), False), (too_many_connections(4), True)])
def test_the_connection_guards_answers_say_it_too(error, retry):
    head = error_response(error).split(b"\r\n\r\n")[0]
    assert f"x-should-retry: {'true' if retry else 'false'}".encode() in head.split(b"\r\n")
    assert (b"retry-after: 1" in head.split(b"\r\n")) == retry

"""Error messages quote at most ECHOED_CHARS of a client's value, so no error body grows with the input (a 4 MB role
came back whole; issue 34 item 9: so did a 3 MB model name). Every error builder that quotes one goes through echo."""

import pytest

from llmq_api import admission, validation
from llmq_api.batch_jobs import access, batches
from llmq_core import requests
from llmq_core.requests import ECHOED_CHARS, RequestError, echo
from llmq_jobs import jobs

HUGE = "u" * 1800  # under the unit app's 2000-byte body limit; the cut does not depend on the size
SMALL_BODY_BYTES = 600
SMALL_MESSAGE_CHARS = 300


def test_echo_cuts_strings_and_huge_ints():
    assert echo("abc") == "'abc'" and echo(HUGE) == repr("u" * ECHOED_CHARS) + "..."
    assert echo(HUGE, quote=False) == "u" * ECHOED_CHARS + "..."
    assert echo(7) == "7" and echo(-0.5) == "-0.5" and echo(True) == "True"
    assert len(echo(10**5000)) <= ECHOED_CHARS + 3  # str() of it would raise (Python's 4,300-digit limit)


def _error(build) -> RequestError:
    """The error ``build`` raises or returns."""
    try:
        error = build()
    except RequestError as exc:
        return exc
    assert isinstance(error, RequestError), error
    return error


@pytest.mark.parametrize(
    "build",
    [
        lambda: requests.check_model(HUGE, {"llmq-sim": 0}),
        lambda: requests.check_role(0, HUGE),
        lambda: requests.bad_token_id(HUGE),
        lambda: requests.at_least("max_tokens", -(10**5000), 1),
        lambda: requests.in_range("seed", 10**5000, 0, 1),
        lambda: access.not_found("file", HUGE),
        lambda: access.not_found("batch", HUGE),
        lambda: admission.model_unavailable(HUGE, 1, deferred_allowed=True),
        lambda: validation.check_content_type(HUGE),
        lambda: validation.parse_timeout_ms(HUGE, 1, 2),
        lambda: validation.parse_traffic_class(HUGE),
        lambda: batches._check_metadata({HUGE: "v"}),
    ],
)
def test_every_builder_quotes_a_clients_value_cut(build):
    error = _error(build)
    assert len(error.message) < SMALL_MESSAGE_CHARS and "u" * (ECHOED_CHARS + 1) not in error.message
    assert "u" * (ECHOED_CHARS + 1) not in (error.param or "")


def test_a_completion_window_is_quoted_cut():
    with pytest.raises(ValueError) as info:
        jobs.parse_window(HUGE, 86_400)
    assert len(str(info.value)) < SMALL_MESSAGE_CHARS


@pytest.mark.parametrize(
    "path,body,headers",
    [
        ("/v1/chat/completions", {"model": "llmq-sim", "messages": [{"role": HUGE, "content": "hi"}]}, {}),
        (
            "/v1/chat/completions",
            {"model": "llmq-sim", "messages": [{"role": "user", "content": [{"type": HUGE, "text": "hi"}]}]},
            {},
        ),
        ("/v1/completions", {"model": HUGE, "prompt": "hi"}, {}),
        ("/v1/chat/completions", {"model": HUGE, "messages": [{"role": "user", "content": "hi"}]}, {}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi", "logit_bias": {HUGE: 1}}, {}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"x-llmq-timeout-ms": HUGE}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"x-llmq-class": HUGE}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"content-type": HUGE}),
        ("/v1/batches", {"input_file_id": "file-x", "endpoint": HUGE, "completion_window": "24h"}, {}),
        ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/completions", "completion_window": HUGE}, {}),
        ("/v1/batches", {"input_file_id": HUGE, "endpoint": "/v1/completions", "completion_window": "24h"}, {}),
    ],
)
async def test_a_4_mb_value_gets_a_small_400(setup, path, body, headers):
    client, _, _, _ = setup
    response = await client.post(path, json=body, headers=headers)
    assert response.status_code in (400, 404, 415) and len(response.content) < SMALL_BODY_BYTES, response.content[:200]


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/models/{HUGE}",
        f"/v1/requests/{HUGE}",
        f"/v1/files/{HUGE}",
        f"/v1/batches/{HUGE}",
        f"/v1/files?after={HUGE}",
    ],
)
async def test_a_huge_id_gets_a_small_404(setup, path):
    client, _, _, _ = setup
    response = await client.get(path)
    assert response.status_code == 404 and len(response.content) < SMALL_BODY_BYTES, response.content[:200]


@pytest.mark.parametrize("limit", ["-1", "0", "10001", "9" * 5000])
async def test_files_limit_out_of_range_is_a_400_naming_it(setup, limit):
    client, _, _, _ = setup
    response = await client.get(f"/v1/files?limit={limit}")
    assert response.status_code == 400 and response.json()["error"]["param"] == "limit"
    assert len(response.content) < SMALL_BODY_BYTES

"""Error messages quote at most ECHOED_CHARS of a client's value, so no error body grows with the input (a 4 MB role came back whole)."""

import pytest

from llmq_core.requests import ECHOED_CHARS, echo

HUGE = "u" * 1800  # under the unit app's 2000-byte body limit; the cut does not depend on the size
SMALL_BODY_BYTES = 600


def test_echo_cuts_strings_and_huge_ints():
    assert echo("abc") == "'abc'" and echo(HUGE) == repr("u" * ECHOED_CHARS) + "..."
    assert len(echo(10**5000)) < 2 * ECHOED_CHARS  # str() of it would raise (Python's 4,300-digit limit)


@pytest.mark.parametrize(
    "path,body,headers",
    [
        ("/v1/chat/completions", {"model": "llmq-sim", "messages": [{"role": HUGE, "content": "hi"}]}, {}),
        (
            "/v1/chat/completions",
            {"model": "llmq-sim", "messages": [{"role": "user", "content": [{"type": HUGE, "text": "hi"}]}]},
            {},
        ),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi", "logit_bias": {HUGE: 1}}, {}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"x-llmq-timeout-ms": HUGE}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"x-llmq-class": HUGE}),
        ("/v1/completions", {"model": "llmq-sim", "prompt": "hi"}, {"content-type": HUGE}),
        ("/v1/batches", {"input_file_id": "file-x", "endpoint": HUGE, "completion_window": "24h"}, {}),
        ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/completions", "completion_window": HUGE}, {}),
    ],
)
async def test_a_4_mb_value_gets_a_small_400(setup, path, body, headers):
    client, _, _, _ = setup
    response = await client.post(path, json=body, headers=headers)
    assert response.status_code in (400, 415) and len(response.content) < SMALL_BODY_BYTES, response.content[:200]


@pytest.mark.parametrize("limit", ["-1", "0", "10001", "9" * 5000])
async def test_files_limit_out_of_range_is_a_400_naming_it(setup, limit):
    client, _, _, _ = setup
    response = await client.get(f"/v1/files?limit={limit}")
    assert response.status_code == 400 and response.json()["error"]["param"] == "limit"
    assert len(response.content) < SMALL_BODY_BYTES

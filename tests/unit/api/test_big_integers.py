"""Integers past Python's int-conversion limit (4,300 digits) anywhere a client sends one: a 400 naming the parameter,
never the 500 of int()'s ValueError."""

import json

import pytest

from llmq_api.batch_jobs.inputs import Limits, check_input
from llmq_api.validation import INT64_MAX, bounded_int
from llmq_core.settings import Settings

HUGE = "9" * 5000


@pytest.mark.parametrize(
    "text, cap, expected",
    [
        ("0", 10, 0),
        ("007", 10, 7),
        ("10", 10, 10),
        ("11", 10, 10),
        (HUGE, 10, 10),
        ("0" * 5000 + "3", 10, 3),
        ("", 10, None),
        ("+1", 10, None),
        ("-1", 10, None),
        ("1.0", 10, None),
        (" 1", 10, None),
        ("²", 10, None),
        ("١٢", 10, None),
        (HUGE, INT64_MAX + 1, INT64_MAX + 1),
    ],
)
def test_bounded_int_never_converts_more_digits_than_the_cap_needs(text, cap, expected):
    assert bounded_int(text, cap) == expected


async def _assert_400_naming(response, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert len(error["message"]) < 300  # the value is quoted shortened, not 5,000 digits long


async def test_a_huge_timeout_header_is_a_400_naming_it(setup):
    client, _, worker, _ = setup
    response = await client.post(
        "/v1/completions", json={"model": "llmq-sim", "prompt": "x"}, headers={"x-llmq-timeout-ms": HUGE}
    )
    await _assert_400_naming(response, "x-llmq-timeout-ms")
    assert worker.produced == []


async def test_a_huge_logit_bias_key_is_a_400_naming_it(make_app):
    client, _, worker, _ = await make_app(Settings(api={"max_body_bytes": 64_000}))
    for key in (HUGE, str(INT64_MAX + 1)):
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "llmq-sim", "messages": [{"role": "user", "content": "x"}], "logit_bias": {key: 1}},
        )
        await _assert_400_naming(response, "logit_bias")
    assert worker.produced == []


async def test_a_logit_bias_key_with_leading_zeros_names_the_token_id(make_app):
    client, _, _, _ = await make_app(Settings(api={"max_body_bytes": 64_000}))
    response = await client.post(
        "/v1/completions", json={"model": "llmq-sim", "prompt": "x", "logit_bias": {"0" * 5000 + "5": 101}}
    )
    await _assert_400_naming(response, "logit_bias[5]")


def test_a_batch_line_with_a_huge_logit_bias_key_is_an_errored_line_of_its_own():
    lines = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "llmq-sim", "prompt": "x", **extra},
        }
        for custom_id, extra in (("bad", {"logit_bias": {HUGE: 1}}), ("good", {}))
    ]
    checked = check_input(
        "\n".join(json.dumps(line) for line in lines).encode(),
        "/v1/completions",
        {"llmq-sim": 0},
        Limits(max_lines=10, max_line_bytes=100_000),
    )
    assert checked.errors == []
    bad, good = checked.lines
    assert bad.error is not None and (bad.error.status, bad.error.param) == (400, "logit_bias")
    assert good.valid is not None and good.error is None

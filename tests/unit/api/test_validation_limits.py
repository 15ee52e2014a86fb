"""validation.py, issue 12: what could not fit in one result, and stop sequences past their limits, are 400s."""

import msgspec
import pytest

from llmq_api.errors import ApiError
from llmq_api.validation import parse_chat, parse_completion
from llmq_core.constants import MAX_RESULT_BYTES
from llmq_core.requests import DEFAULT_MAX_STOP_BYTES, MAX_STOP_SEQUENCES
from llmq_core.settings import Settings

MODELS = {"llmq-sim": 0}
CHAT = [{"role": "user", "content": "hi"}]


def completion(**fields) -> bytes:
    return msgspec.json.encode({"model": "llmq-sim", "prompt": "x", **fields})


def rejected(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **kwargs)
    return info.value


def test_the_largest_result_that_fits_is_accepted():
    valid = parse_completion(completion(n=128, max_tokens=MAX_RESULT_BYTES // 128), MODELS)
    assert valid.sampling.n * valid.sampling.max_tokens == MAX_RESULT_BYTES


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"n": 128, "max_tokens": MAX_RESULT_BYTES // 128 + 1}, "max_tokens"),
        ({"max_tokens": MAX_RESULT_BYTES + 1}, "max_tokens"),
        ({"n": 2, "max_tokens": 2**62}, "max_tokens"),
    ],
)
def test_a_result_that_could_exceed_the_cap_is_a_400_naming_max_tokens(fields, param):
    error = rejected(parse_completion, completion(**fields), MODELS)
    assert (error.status, error.param, error.code) == (400, param, "result_too_large")
    assert str(MAX_RESULT_BYTES) in error.body()["error"]["message"]


def test_chat_names_max_completion_tokens_when_that_set_the_size():
    raw = msgspec.json.encode({"model": "llmq-sim", "messages": CHAT, "n": 64, "max_completion_tokens": 20_000})
    assert rejected(parse_chat, raw, MODELS).param == "max_completion_tokens"


def test_n_alone_is_named_when_max_tokens_is_left_at_its_default(monkeypatch):
    import llmq_core.requests as requests

    monkeypatch.setattr(requests, "MAX_N", 10**6)  # today n <= 128 keeps n x 16 under the cap: widen n to reach it
    error = rejected(parse_completion, completion(n=MAX_RESULT_BYTES // 16 + 1), MODELS)
    assert (error.status, error.param) == (400, "n")


def test_stop_sequences_up_to_the_byte_limit_are_accepted():
    stops = ["é" * (DEFAULT_MAX_STOP_BYTES // 2)] * MAX_STOP_SEQUENCES
    assert parse_completion(completion(stop=stops), MODELS).sampling.stop == stops


@pytest.mark.parametrize(
    "stop",
    [
        "a" * (DEFAULT_MAX_STOP_BYTES + 1),
        ["ok", "é" * (DEFAULT_MAX_STOP_BYTES // 2 + 1)],  # 129 characters, 258 bytes: the limit is in UTF-8 bytes
        "x" * (1 << 20),  # the 1 MB stop string: a 400, not a retryable 503
        ["a"] * (MAX_STOP_SEQUENCES + 1),
    ],
)
def test_stop_past_its_limits_is_a_400_naming_stop(stop):
    for call, raw in (
        (parse_completion, completion(stop=stop)),
        (parse_chat, msgspec.json.encode({"model": "llmq-sim", "messages": CHAT, "stop": stop})),
    ):
        error = rejected(call, raw, MODELS)
        assert (error.status, error.param) == (400, "stop")
        assert error.body()["error"]["type"] == "invalid_request_error"


def test_the_stop_byte_limit_is_configurable():
    raw = completion(stop="abcd")
    assert parse_completion(raw, MODELS, max_stop_bytes=4).sampling.stop == ["abcd"]
    assert rejected(parse_completion, raw, MODELS, max_stop_bytes=3).param == "stop"


async def test_the_pod_applies_its_stop_byte_setting(make_app):
    client, _, worker, _ = await make_app(Settings(api={"max_stop_bytes": 8}))
    ok = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "x", "stop": "12345678"})
    refused = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "x", "stop": "123456789"})
    assert ok.status_code == 200
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "stop")
    assert len(worker.produced) == 1  # the refused one never reached Kafka

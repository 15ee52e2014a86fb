"""validation.py: every client mistake is a 4xx naming its param; valid bodies map onto wire.SamplingParams."""

import msgspec
import pytest

from llmq_api.errors import ApiError
from llmq_api.validation import (
    DEFAULT_MAX_TOKENS,
    check_content_type,
    check_declared_length,
    parse_chat,
    parse_completion,
    parse_sdk_read_timeout_ms,
    parse_timeout_ms,
    parse_traffic_class,
)
from llmq_core import wire
from llmq_core.constants import MAX_RESULT_BYTES
from llmq_core.tokenizer import render_chat

MODELS = {"llmq-sim": 100, "mystery": 0}


def body(**fields) -> bytes:
    return msgspec.json.encode({"model": "llmq-sim", **fields})


def rejected(call, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    return info.value


def test_completion_maps_sampling_params():
    valid = parse_completion(
        body(
            prompt="abc",
            max_tokens=5,
            temperature=0,
            top_p=0.5,
            n=2,
            stop="\n",
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
            user="u",
        ),
        MODELS,
    )
    assert valid.endpoint == "completions" and valid.prompt == "abc" and valid.messages is None
    assert valid.sampling == wire.SamplingParams(max_tokens=5, temperature=0.0, top_p=0.5, stop=["\n"], seed=7, n=2)
    assert valid.stream and valid.include_usage and valid.prompt_tokens == 3


def test_defaults_and_null_max_tokens():
    valid = parse_completion(body(prompt=["héllo"], max_tokens=None, stop=None), MODELS)
    assert valid.prompt == "héllo" and valid.prompt_tokens == 6  # UTF-8 bytes
    assert valid.sampling == wire.SamplingParams(max_tokens=DEFAULT_MAX_TOKENS)
    assert not valid.stream and not valid.include_usage


def test_chat_renders_prompt_and_prefers_max_completion_tokens():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    valid = parse_chat(body(messages=messages, max_tokens=3, max_completion_tokens=4), MODELS)
    assert valid.messages == [
        wire.ChatMessage(role="system", content="be brief"),
        wire.ChatMessage(role="user", content="hi there"),
    ]
    assert valid.sampling.max_tokens == 4
    assert valid.prompt_tokens == len(render_chat(valid.messages).encode())


@pytest.mark.parametrize(
    "limit",
    [{}, {"max_tokens": None}, {"max_completion_tokens": None}, {"max_tokens": None, "max_completion_tokens": None}],
)
def test_chat_without_max_tokens_fills_the_context_window(limit):
    valid = parse_chat(body(messages=[{"role": "user", "content": "hi"}], **limit), MODELS)
    assert valid.sampling.max_tokens == 100 - valid.prompt_tokens > DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    "n, window, expected",
    [
        (1, 0, MAX_RESULT_BYTES),  # unknown window: the result cap alone
        (4, 0, MAX_RESULT_BYTES // 4),  # n choices share the cap
        (1, 8 * MAX_RESULT_BYTES, MAX_RESULT_BYTES),  # a window larger than the cap
    ],
)
def test_chat_without_max_tokens_stops_at_the_result_cap(n, window, expected):
    valid = parse_chat(body(messages=[{"role": "user", "content": "hi"}], n=n), {"llmq-sim": window})
    assert valid.sampling.max_tokens == expected


def test_chat_prompt_filling_the_window_without_max_tokens_is_too_long():
    content = "a" * (100 - len(render_chat([wire.ChatMessage(role="user", content="")]).encode()))
    error = rejected(parse_chat, body(messages=[{"role": "user", "content": content}]), MODELS)
    assert (error.status, error.param, error.code) == (400, "messages", "context_length_exceeded")
    fits = parse_chat(body(messages=[{"role": "user", "content": content[1:]}]), MODELS)
    assert fits.prompt_tokens == 99 and fits.sampling.max_tokens == 1


def test_completions_keep_the_legacy_default_of_16():
    assert parse_completion(body(prompt="hi"), MODELS).sampling.max_tokens == DEFAULT_MAX_TOKENS == 16


@pytest.mark.parametrize(
    "raw, param",
    [
        (b'{"model": "llmq-sim", "prompt": "a",', None),
        (b"[1, 2]", None),
        (b'"text"', None),
        (b"", None),
        (b"\xff\xfe", None),
        (body(prompt="a", max_tokens="5"), "max_tokens"),
        (body(prompt="a", max_tokens=1.5), "max_tokens"),
        (body(prompt="a", max_tokens=0), "max_tokens"),
        (body(prompt="a", max_tokens=-1), "max_tokens"),
        (body(prompt="a", temperature=2.5), "temperature"),
        (body(prompt="a", temperature=True), "temperature"),
        (body(prompt="a", top_p=-0.1), "top_p"),
        (body(prompt="a", n=0), "n"),
        (body(prompt="a", n=1000), "n"),
        (body(prompt="a", stop=["a", "b", "c", "d", "e"]), "stop"),
        (body(prompt="a", stop=[""]), "stop"),
        (body(prompt="a", stop=[1]), "stop[0]"),
        (body(prompt="a", seed=2**70), "seed"),
        (body(prompt="a", stream="yes"), "stream"),
        (body(prompt="a", stream_options={"include_usage": True}), "stream_options"),
        (body(prompt="a", echo=True), "echo"),
        (body(prompt="a", logprobs=6), "logprobs"),
        (body(prompt="a", logprobs=-1), "logprobs"),
        (body(prompt="a", logprobs=True), "logprobs"),
        (body(prompt="a", best_of=3), "best_of"),
        (body(prompt="a", presence_penalty=1.0), "presence_penalty"),
        (body(prompt=""), "prompt"),
        (body(prompt=[]), "prompt"),
        (body(prompt=["a", "b"]), "prompt"),
        (body(prompt=[1, 2, 3]), "prompt"),
        (body(prompt=[[1, 2]]), "prompt"),
        (body(prompt=None), "prompt"),
        (body(prompt=5), "prompt"),
        (msgspec.json.encode({"prompt": "a"}), "model"),
        (body(model=3, prompt="a"), "model"),
    ],
)
def test_completion_client_errors_are_400_naming_the_param(raw, param):
    error = rejected(parse_completion, raw, MODELS)
    assert error.status == 400
    assert error.param == param
    assert error.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            "response_format",
        ),
    ],
)
def test_chat_client_errors_are_400_naming_the_param(fields, param):
    error = rejected(parse_chat, body(**fields), MODELS)
    assert (error.status, error.param) == (400, param)


@pytest.mark.parametrize(
    "fields, logprobs",
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 0}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
    ],
)
def test_chat_logprobs_and_top_logprobs_become_the_alternatives_per_token(fields, logprobs):
    valid = parse_chat(body(messages=[{"role": "user", "content": "x"}], **fields), MODELS)
    assert valid.sampling.logprobs == logprobs


@pytest.mark.parametrize("logprobs", [None, 0, 5])
def test_completion_logprobs_up_to_5_are_the_alternatives_per_token(logprobs):
    assert parse_completion(body(prompt="a", logprobs=logprobs), MODELS).sampling.logprobs == logprobs


def test_unknown_model_is_404_model_not_found():
    error = rejected(parse_completion, body(model="gpt-4", prompt="a"), MODELS)
    assert (error.status, error.param, error.code) == (404, "model", "model_not_found")


def test_context_window_counts_prompt_plus_max_tokens():
    assert parse_completion(body(prompt="a" * 90, max_tokens=10), MODELS).prompt_tokens == 90
    error = rejected(parse_completion, body(prompt="a" * 90, max_tokens=11), MODELS)
    assert (error.status, error.param, error.code) == (400, "max_tokens", "context_length_exceeded")
    assert "maximum context length is 100 tokens" in error.message and "101 tokens" in error.message


def test_prompt_alone_over_the_window_names_the_prompt():
    error = rejected(parse_completion, body(prompt="a" * 101), MODELS)
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")
    chat = rejected(parse_chat, body(messages=[{"role": "user", "content": "a" * 100}], max_tokens=1), MODELS)
    assert (chat.param, chat.code) == ("messages", "context_length_exceeded")


def test_unknown_context_window_skips_the_check():
    assert parse_completion(body(model="mystery", prompt="a" * 1000, max_tokens=1000), MODELS).model == "mystery"


@pytest.mark.parametrize("value", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_pass(value):
    check_content_type(value)


@pytest.mark.parametrize("value", [None, "", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_other_content_types_are_415(value):
    assert rejected(check_content_type, value).status == 415


def test_declared_length_over_limit_is_413():
    check_declared_length("100", 100)
    check_declared_length(None, 100)
    assert rejected(check_declared_length, "101", 100).status == 413


@pytest.mark.parametrize("value, expected", [(None, 30_000), ("1500", 1500), (" 20 ", 20), ("999999999", 600_000)])
def test_timeout_header_default_and_clamp(value, expected):
    assert parse_timeout_ms(value, 30_000, 600_000) == expected


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "abc", "", "1e3"])
def test_bad_timeout_header_is_400(value):
    error = rejected(parse_timeout_ms, value, 30_000, 600_000)
    assert (error.status, error.param) == (400, "x-llmq-timeout-ms")


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), ("600", 600_000), ("120.0", 120_000), (" 0.25 ", 250), ("3.14159", 3141), ("9" * 5000, 600_000)],
)
def test_the_sdks_read_timeout_in_seconds_is_taken_in_ms_and_clamped(value, expected):
    assert parse_sdk_read_timeout_ms(value, 600_000) == expected


@pytest.mark.parametrize("value", ["0", "0.0", "0.0004", "-5", "1e-05", "inf", "nan", "", "1.", "²"])
def test_a_bad_sdk_read_timeout_is_400(value):
    error = rejected(parse_sdk_read_timeout_ms, value, 600_000)
    assert (error.status, error.param) == (400, "x-stainless-read-timeout")


def test_traffic_class_header():
    assert parse_traffic_class(None) == "interactive"
    assert parse_traffic_class("Deferred") == "deferred"
    assert rejected(parse_traffic_class, "urgent").param == "x-llmq-class"

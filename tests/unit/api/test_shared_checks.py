"""llmq_core.requests: one implementation of a request's content checks. The same fault gets the same error object
(status, message, type, param, code) from an API body and from a wire request produced straight to Kafka."""

from __future__ import annotations

import msgspec
import pytest

from llmq_api.errors import ApiError
from llmq_api.validation import parse_chat, parse_completion
from llmq_core import requests, wire
from llmq_core.constants import CONTENT_TYPE_JSON, MAX_LOGIT_BIAS_TOKENS

RULES = requests.Rules()
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "n", "stop", "seed")
T0 = 1_700_000_000_000

CASES = [  # (body fields beyond model and prompt, expected status, param, code)
    ({"model": "no-such-model"}, 404, "model", "model_not_found"),
    ({"temperature": 9}, 400, "temperature", "out_of_range"),
    ({"top_p": 1.5}, 400, "top_p", "out_of_range"),
    ({"n": 0}, 400, "n", "out_of_range"),
    ({"n": requests.MAX_N + 1}, 400, "n", "out_of_range"),
    ({"max_tokens": 0}, 400, "max_tokens", "out_of_range"),
    ({"n": 2, "max_tokens": 600_000}, 400, "max_tokens", "result_too_large"),
    ({"max_tokens": 8192}, 400, "max_tokens", "context_length_exceeded"),
    ({"stop": ["a"] * (requests.MAX_STOP_SEQUENCES + 1)}, 400, "stop", "too_many_values"),
    ({"stop": [""]}, 400, "stop", "invalid_value"),
    ({"stop": ["x" * (requests.DEFAULT_MAX_STOP_BYTES + 1)]}, 400, "stop", "stop_too_long"),
    ({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)}}, 400, "logit_bias", "too_many_values"),
    ({"logit_bias": {"65": 101}}, 400, "logit_bias[65]", "out_of_range"),
    ({"prompt": ""}, 400, "prompt", "invalid_value"),
    ({"max_tokens": 2**63 - 1}, 400, "max_tokens", "result_too_large"),
]


def wire_request(body: dict) -> wire.GenerationRequest:
    """The body as a Kafka producer would write it (the same values in a JSON GenerationRequest), as consumed."""
    sampling = {k: body[k] for k in SAMPLING_FIELDS if k in body}
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    bias = {int(k): float(v) for k, v in body["logit_bias"].items()} if "logit_bias" in body else None
    chat = "messages" in body
    messages = [wire.ChatMessage(**m) for m in body["messages"]] if chat else None
    request = wire.GenerationRequest(
        request_id="r",
        model=body["model"],
        endpoint="chat.completions" if chat else "completions",
        prompt=None if chat else body["prompt"],
        messages=messages,
        sampling=wire.SamplingParams(**sampling, logit_bias=bias),
        created_ms=T0,
        deadline_ms=T0 + 1000,
        reply_to=wire.KafkaReply(topic="t"),
    )
    return wire.decode(wire.encode(request, CONTENT_TYPE_JSON))


def both_errors(body: dict, parse=parse_completion) -> tuple[tuple, tuple]:
    with pytest.raises(ApiError) as http:
        parse(msgspec.json.encode(body), RULES.windows)
    with pytest.raises(requests.RequestError) as direct:
        requests.check_request(wire_request(body), RULES)
    fields = ("status", "message", "type", "param", "code")
    return tuple(getattr(http.value, f) for f in fields), tuple(getattr(direct.value, f) for f in fields)


@pytest.mark.parametrize(("fields", "status", "param", "code"), CASES)
def test_a_fault_gets_the_same_error_over_http_and_from_kafka(fields, status, param, code):
    http, direct = both_errors({"model": "llmq-sim", "prompt": "hello", **fields})
    assert http == direct
    assert (http[0], http[3], http[4]) == (status, param, code)


def test_an_integer_past_int64_is_a_400_over_http_and_undecodable_from_kafka():
    body = {"model": "llmq-sim", "prompt": "hello", "seed": -(2**63) - 1}
    with pytest.raises(ApiError) as http:
        parse_completion(msgspec.json.encode(body), RULES.windows)
    assert (http.value.status, http.value.param, http.value.code) == (400, "seed", "out_of_range")
    with pytest.raises(msgspec.ValidationError):  # the batcher dead-letters such a record (wire bounds)
        wire_request(body)


@pytest.mark.parametrize(
    ("messages", "param"), [([], "messages"), ([{"role": "robot", "content": "x"}], "messages[0].role")]
)
def test_chat_faults_match_too(messages, param):
    http, direct = both_errors({"model": "llmq-sim", "messages": messages}, parse_chat)
    assert http == direct and http[3] == param


def test_a_valid_request_passes():
    requests.check_request(
        wire_request({"model": "llmq-sim", "prompt": "hello", "temperature": 2, "n": 4, "logit_bias": {"65": -100}}),
        RULES,
    )


def test_extra_models_join_the_catalogue_with_an_unknown_window():
    from llmq_core.settings import Settings

    rules = requests.Rules.from_settings(Settings(models={"extra": ["my-model"]}))
    assert rules.windows["my-model"] == 0 and rules.windows["llmq-sim"] == 8192
    requests.check_request(wire_request({"model": "my-model", "prompt": "x" * 100_000}), rules)


@pytest.mark.parametrize(
    ("created", "deadline", "now", "expected"),
    [
        (T0, T0 + 5_000, T0, T0 + 5_000),  # within the maximum: unchanged
        (T0, T0 + 10**12, T0, T0 + 60_000),  # beyond: clamped to created + maximum
        (T0 + 10**9, T0 + 10**12, T0, T0 + 60_000),  # created in the future: counted from now
    ],
)
def test_deadlines_are_clamped_to_the_class_maximum(created, deadline, now, expected):
    request = msgspec.structs.replace(
        wire_request({"model": "llmq-sim", "prompt": "x"}), created_ms=created, deadline_ms=deadline
    )
    assert requests.clamp_deadline(request, 60_000, now).deadline_ms == expected


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"api_format": "gemini"}, "api_format"),
        ({"api_format": "anthropic"}, "endpoint"),  # Anthropic's format is its Messages API's: chats only
        ({"reply_to": wire.KafkaReply(topic="t", body="openai")}, "reply_to.body"),
    ],
)
def test_a_kafka_direct_request_names_a_format_llmq_writes(fields, param):
    request = msgspec.structs.replace(wire_request({"model": "llmq-sim", "prompt": "hello"}), **fields)
    with pytest.raises(requests.RequestError) as raised:
        requests.check_request(request, RULES)
    assert (raised.value.status, raised.value.param) == (400, param)


def test_a_kafka_direct_request_may_not_carry_a_continuation():
    """Only a batcher continues a request (from tokens its workers wrote): a producer's would inject text as if
    generated, past the model and its usage."""
    forged = wire.Continuation(token_ids=[[72, 105]])
    request = msgspec.structs.replace(wire_request({"model": "llmq-sim", "prompt": "hello"}), continuation=forged)
    with pytest.raises(requests.RequestError) as raised:
        requests.check_request(request, RULES)
    assert (raised.value.status, raised.value.param, raised.value.type) == (
        400,
        "continuation",
        "invalid_request_error",
    )


def test_an_anthropic_chat_with_an_api_reply_passes():
    chat = wire_request({"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}]})
    reply = wire.KafkaReply(topic="t", body="api")
    requests.check_request(msgspec.structs.replace(chat, api_format="anthropic", reply_to=reply), RULES)


@pytest.mark.parametrize("logprobs, refused", [(None, False), (0, False), (20, False), (21, True)])
def test_a_kafka_direct_request_may_ask_up_to_20_alternatives_per_token(logprobs, refused):
    request = wire_request({"model": "llmq-sim", "prompt": "hi"})
    request = msgspec.structs.replace(request, sampling=wire.SamplingParams(logprobs=logprobs))
    if not refused:
        requests.check_request(request, RULES)
        return
    with pytest.raises(requests.RequestError) as caught:
        requests.check_request(request, RULES)
    assert (caught.value.param, caught.value.code) == ("logprobs", "out_of_range")

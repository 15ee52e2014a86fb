"""Every client error names what went wrong in all four fields of OpenAI's error object: message, type, param and a
code from llmq_core.status.ErrorCode (or the API's own for what only HTTP has, such as ``invalid_json``), over every
validation path: headers, bodies, the shared content checks, and an engine's own check (a logit_bias id outside the
vocabulary) answered through its FinalResult (tests/unit/worker/test_worker_core.py: the core carries them over). Errors about the body as a whole (empty, not JSON, not an object) have
no single field to name: their param is null, as OpenAI's are."""

from __future__ import annotations

import msgspec
import pytest

from llmq_api import validation
from llmq_api.admission import ShedPolicy
from llmq_api.errors import ApiError
from llmq_api.openai_format import error_for
from llmq_api.saturation import Saturation
from llmq_core import requests, wire
from llmq_core.constants import DEFERRED, INTERACTIVE, MAX_LOGIT_BIAS_TOKENS, TRAFFIC_CLASSES
from llmq_core.status import ErrorCode
from llmq_worker.engine import InvalidRequest, check_request
from tests.builders import generation_request

MODELS = requests.Rules().windows
COMPLETION = {"model": "llmq-sim", "prompt": "hi"}
CHAT = {"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}]}
BODY_LEVEL = "invalid_json"  # the one code whose param is null by design

BODIES = [  # (parser, body) -> a 400 or 404
    (validation.parse_completion, {**COMPLETION, "prompt": ""}),
    (validation.parse_completion, {"model": "llmq-sim"}),
    (validation.parse_completion, {"prompt": "hi"}),
    (validation.parse_completion, {**COMPLETION, "prompt": ["a", "b"]}),
    (validation.parse_completion, {**COMPLETION, "prompt": 5}),
    (validation.parse_completion, {**COMPLETION, "echo": True}),
    (validation.parse_completion, {**COMPLETION, "presence_penalty": 1}),
    (validation.parse_completion, {**COMPLETION, "model": "nope"}),
    (validation.parse_completion, {**COMPLETION, "max_tokens": 0}),
    (validation.parse_completion, {**COMPLETION, "max_tokens": 2**63 - 1}),
    (validation.parse_completion, {**COMPLETION, "max_tokens": 8192}),
    (validation.parse_completion, {**COMPLETION, "temperature": 3}),
    (validation.parse_completion, {**COMPLETION, "top_p": -1}),
    (validation.parse_completion, {**COMPLETION, "n": 0}),
    (validation.parse_completion, {**COMPLETION, "seed": -(2**63) - 1}),
    (validation.parse_completion, {**COMPLETION, "n": 4, "max_tokens": 300_000}),
    (validation.parse_completion, {**COMPLETION, "stop": ["a", "b", "c", "d", "e"]}),
    (validation.parse_completion, {**COMPLETION, "stop": [""]}),
    (validation.parse_completion, {**COMPLETION, "stop": ["x" * (requests.DEFAULT_MAX_STOP_BYTES + 1)]}),
    (validation.parse_completion, {**COMPLETION, "logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)}}),
    (validation.parse_completion, {**COMPLETION, "logit_bias": {"x": 1}}),
    (validation.parse_completion, {**COMPLETION, "logit_bias": {"65": 101}}),
    (validation.parse_completion, {**COMPLETION, "stream_options": {"include_usage": True}}),
    (validation.parse_chat, {**CHAT, "messages": []}),
    (validation.parse_chat, {"model": "llmq-sim"}),
    (validation.parse_chat, {**CHAT, "messages": [{"role": "robot", "content": "hi"}]}),
    (validation.parse_chat, {**CHAT, "messages": [{"role": "user"}]}),
    (validation.parse_chat, {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    (validation.parse_chat, {**CHAT, "messages": [{"content": "hi"}]}),
    (validation.parse_chat, {**CHAT, "tools": [{}]}),
    (validation.parse_chat, {**CHAT, "max_completion_tokens": -1}),
]
RAW_BODIES = [b"", b"   ", b"{", b"[]", b'"text"']


def assert_all_set(error: ApiError) -> None:
    fields = {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
    assert all(isinstance(value, str) and value for value in fields.values()), fields


@pytest.mark.parametrize(("parse", "body"), BODIES, ids=[msgspec.json.encode(body).decode()[:70] for _, body in BODIES])
def test_every_body_fault_names_message_type_param_and_code(parse, body):
    with pytest.raises(ApiError) as info:
        parse(msgspec.json.encode(body), MODELS)
    assert_all_set(info.value)


@pytest.mark.parametrize("raw", RAW_BODIES)
def test_a_body_that_is_no_json_object_has_a_code_and_no_param(raw):
    with pytest.raises(ApiError) as info:
        validation.parse_completion(raw, MODELS)
    assert (info.value.code, info.value.param) == (BODY_LEVEL, None) and info.value.message and info.value.type


@pytest.mark.parametrize(
    "check",
    [
        lambda: validation.parse_traffic_class("urgent"),
        lambda: validation.parse_timeout_ms("soon", 1000, 5000),
        lambda: validation.parse_timeout_ms("0", 1000, 5000),
        lambda: validation.check_content_type("text/plain"),
    ],
    ids=["traffic-class", "timeout-text", "timeout-zero", "content-type"],
)
def test_every_header_fault_names_message_type_param_and_code(check):
    with pytest.raises(ApiError) as info:
        check()
    assert_all_set(info.value)


def test_a_max_tokens_range_error_names_a_bound_that_means_something():
    with pytest.raises(ApiError) as low:
        validation.parse_completion(msgspec.json.encode({**COMPLETION, "max_tokens": 0}), MODELS)
    with pytest.raises(ApiError) as high:
        validation.parse_completion(msgspec.json.encode({**COMPLETION, "max_tokens": 2**63 - 1}), MODELS)
    assert low.value.message == "'max_tokens' must be at least 1, got 0"
    assert str(2**63 - 1) not in low.value.message and "result limit" in high.value.message


@pytest.mark.parametrize(
    ("sampling", "prompt", "param", "code"),
    [
        (wire.SamplingParams(logit_bias={300: 1.0}), "x", "logit_bias", ErrorCode.INVALID_VALUE),  # vocabulary: 259
        (wire.SamplingParams(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)}), "x", "logit_bias", None),
        (wire.SamplingParams(logit_bias={65: 500.0}), "x", "logit_bias", ErrorCode.OUT_OF_RANGE),
        (wire.SamplingParams(max_tokens=0), "x", "max_tokens", ErrorCode.OUT_OF_RANGE),
        (wire.SamplingParams(max_tokens=100), "x", "max_tokens", ErrorCode.CONTEXT_LENGTH_EXCEEDED),
        (wire.SamplingParams(), "", "prompt", ErrorCode.INVALID_VALUE),
    ],
    ids=["id-outside-vocabulary", "too-many-ids", "bias-out-of-range", "max-tokens-0", "context", "empty-prompt"],
)
def test_an_engines_own_refusal_reaches_the_client_with_param_and_code(sampling, prompt, param, code):
    request = generation_request(prompt=prompt, sampling=sampling)
    with pytest.raises(InvalidRequest) as info:
        check_request(request, list(prompt.encode()), context_window=50, vocab_size=259)
    assert info.value.param == param and info.value.code == (code or ErrorCode.TOO_MANY_VALUES)
    error = wire.ErrorInfo(
        type="invalid_request_error", message=str(info.value), param=info.value.param, code=info.value.code
    )
    result = wire.FinalResult(
        request_id="r1", outcome=wire.Outcome.ERRORED, model="llmq-sim", error=error, reply_to=request.reply_to
    )
    answered = error_for(result)
    assert answered.status == 400
    assert_all_set(answered)


@pytest.mark.parametrize(("classes", "suggested"), [(TRAFFIC_CLASSES, True), ((INTERACTIVE,), False)])
def test_model_unavailable_suggests_deferred_only_to_a_key_that_may_use_it(classes, suggested):
    policy = ShedPolicy(wait_ms={}, share={}, max_in_flight=10, max_queued=10, worker_timeout_ms=2000)
    gone = Saturation({}, {"llmq-tiny": 0}, {"llmq-tiny": 1}, 0, 1_000_000)
    rejection = policy.check("interactive_paid", "llmq-tiny", gone, 0, DEFERRED in classes)
    assert rejection.error.code == "model_unavailable"
    assert ("x-llmq-class: deferred" in rejection.error.message) is suggested

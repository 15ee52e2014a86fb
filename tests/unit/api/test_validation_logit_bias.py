"""validation.py: OpenAI's logit_bias (token id string -> bias in [-100, 100]) maps onto wire.SamplingParams.logit_bias."""

import msgspec
import pytest

from llmq_api.errors import ApiError
from llmq_api.validation import parse_chat, parse_completion
from llmq_core.constants import MAX_LOGIT_BIAS_TOKENS

MODELS = {"llmq-sim": 100}


def body(**fields) -> bytes:
    return msgspec.json.encode({"model": "llmq-sim", "prompt": "abc", **fields})


def test_logit_bias_maps_to_int_token_ids():
    valid = parse_completion(body(logit_bias={"50": -100, "7": 2.5, "0": 100}), MODELS)
    assert valid.sampling.logit_bias == {50: -100.0, 7: 2.5, 0: 100.0}
    chat = parse_chat(
        msgspec.json.encode(
            {"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"3": 1}}
        ),
        MODELS,
    )
    assert chat.sampling.logit_bias == {3: 1.0}


@pytest.mark.parametrize("bias", [None, {}])
def test_absent_or_empty_logit_bias_is_none(bias):
    assert parse_completion(body(logit_bias=bias), MODELS).sampling.logit_bias is None


@pytest.mark.parametrize(
    "bias",
    [
        {"abc": 1},
        {"-1": 1},
        {"1.5": 1},
        {" 1": 1},
        {"١": 1},
        {"99999999999999999999": 1},  # not token ids
        {"1": 100.5},
        {"1": -101},  # out of range
        {"1": "high"},
        {"1": True},
        {"1": None},  # not numbers
        {str(i): 1 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)},  # too many
    ],
)
def test_bad_logit_bias_is_a_400_naming_it(bias):
    with pytest.raises(ApiError) as info:
        parse_completion(body(logit_bias=bias), MODELS)
    assert info.value.status == 400 and info.value.param.startswith("logit_bias")


def test_logit_bias_must_be_an_object():
    with pytest.raises(ApiError) as info:
        parse_completion(body(logit_bias=[1, 2]), MODELS)
    assert info.value.status == 400 and info.value.param == "logit_bias"

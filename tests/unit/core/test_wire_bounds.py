"""Every integer of a wire message is bounded to int64 (counts and indexes to non-negative), so a record msgpack could
not carry fails decoding where it is consumed instead of raising wherever it is re-encoded (QA finding 1)."""

from __future__ import annotations

import msgspec
import pytest

from llmq_core import wire
from tests.builders import heartbeat

INT64_MAX = 2**63 - 1
REQUEST = {
    "type": "generation_request",
    "request_id": "r",
    "created_ms": 1,
    "deadline_ms": 2,
    "model": "m",
    "reply_to": {"kind": "kafka", "topic": "t"},
    "prompt": "hi",
}


def decoded(**fields) -> wire.GenerationRequest:
    return wire.decode(msgspec.json.encode({**REQUEST, **fields}))


@pytest.mark.parametrize(
    "fields",
    [
        {"attempt": 2**64},
        {"attempt": -1},
        {"prompt_tokens": INT64_MAX + 1},
        {"prompt_tokens": -1},
        {"created_ms": 2**64},
        {"deadline_ms": -(2**63) - 1},
        {"schema_version": -1},
        {"sampling": {"seed": 2**64}},
        {"sampling": {"n": 2**70}},
        {"sampling": {"max_tokens": -(2**64)}},
        {"sampling": {"logit_bias": {str(2**64): 1.0}}},
    ],
)
def test_an_integer_msgpack_cannot_carry_fails_decoding(fields):
    with pytest.raises(msgspec.ValidationError):
        decoded(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"attempt": INT64_MAX, "prompt_tokens": INT64_MAX, "created_ms": -(2**63), "deadline_ms": INT64_MAX},
        {"sampling": {"seed": -(2**63), "n": 0, "max_tokens": -1, "logit_bias": {str(-(2**63)): 1.0}}},
    ],
)
def test_every_int64_decodes_and_re_encodes(fields):
    request = decoded(**fields)  # out-of-range sampling values are the checks' to answer, with the API's error
    assert wire.decode(wire.encode(request)) == request


@pytest.mark.parametrize(
    "message",
    [
        wire.FinalResult(
            request_id="r",
            outcome=wire.Outcome.SUCCEEDED,
            model="m",
            reply_to=wire.HttpReply(instance_id="p"),
            choices=[wire.Choice(index=-1, text="x")],
        ),
        wire.TokenChunk(request_id="r", text="x", seq=-1, sent_ms=0),
        heartbeat("m", max_slots=1, free_slots=0, est_drain_ms=2**63),
    ],
)
def test_results_chunks_and_heartbeats_are_bounded_too(message):
    with pytest.raises(msgspec.ValidationError):
        wire.decode(wire.encode(message, "application/json"), "application/json")

"""Response shapes, stream chunks and the outcome -> HTTP status mapping."""

import msgspec
import pytest

from llmq_api.openai_format import ChunkFormatter, error_for, outcome_label, response_body
from llmq_api.openai_format import finish_chunks as _finish_chunks
from llmq_api.waiters import Abandoned, DeadlineExceeded
from llmq_core import wire
from tests.unit.api.fakes import final


def events(data: bytes) -> list:
    frames = [f for f in data.split(b"\n\n") if f]
    assert all(f.startswith(b"data: ") for f in frames)
    return [msgspec.json.decode(f[6:]) for f in frames]


def test_completion_and_chat_bodies():
    result = final("r", "hi")
    body = response_body(result, "cmpl-1", "completions", 123)
    assert body["object"] == "text_completion" and body["id"] == "cmpl-1" and body["created"] == 123
    assert body["choices"] == [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chat = response_body(result, "chatcmpl-1", "chat.completions", 123)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi"}


def test_chat_stream_chunks():
    fmt = ChunkFormatter("chatcmpl-1", "chat.completions", "llmq-sim", 5, include_usage=True)
    role, text = events(fmt.role(1) + fmt.text(0, "he"))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""} and role["usage"] is None
    assert text["object"] == "chat.completion.chunk" and text["choices"][0]["delta"] == {"content": "he"}
    last, usage = events(_finish_chunks(fmt, final("r", "hello"), {0: "he"}))
    assert last["choices"][0] == {"index": 0, "delta": {"content": "llo"}, "logprobs": None, "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 8


def test_completion_stream_finish_without_missing_text_or_usage():
    fmt = ChunkFormatter("cmpl-1", "completions", "llmq-sim", 5, include_usage=False)
    assert fmt.role(1) == b""
    (last,) = events(_finish_chunks(fmt, final("r", "hello"), {0: "hello"}))
    assert last["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    assert "usage" not in last


def errored(type_: str, retryable: bool = False) -> wire.FinalResult:
    return final("r", "", wire.Outcome.ERRORED, wire.ErrorInfo(type=type_, message="boom", retryable=retryable))


@pytest.mark.parametrize(
    "resolution, status, label",
    [
        (final("r"), None, "succeeded"),
        (errored("invalid_request_error"), 400, "errored"),
        (errored("engine_error"), 500, "errored"),
        (errored("engine_error", retryable=True), 503, "errored"),
        (errored("overloaded", retryable=True), 429, "errored"),
        (final("r", "", wire.Outcome.ERRORED), 500, "errored"),
        (final("r", "", wire.Outcome.EXPIRED), 504, "expired"),
        (final("r", "", wire.Outcome.CANCELED), 409, "canceled"),
        (DeadlineExceeded(), 504, "deadline"),
        (Abandoned("client_disconnected"), 499, "abandoned"),
    ],
)
def test_status_mapping(resolution, status, label):
    error = error_for(resolution)
    assert (error.status if error else None) == status
    assert outcome_label(resolution) == label
    if error is not None:
        assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_retryable_error_carries_retry_after():
    overloaded = error_for(errored("overloaded", retryable=True))
    assert overloaded.headers == {"retry-after": "1"} and overloaded.code == "rate_limit_exceeded"


def with_calls() -> wire.FinalResult:
    calls = [wire.ToolCall(id=f"call_{i}", name="f", arguments=f'{{"i":{i}}}') for i in range(2)]
    choice = wire.Choice(index=0, text="", finish_reason="stop", tool_calls=calls)
    return msgspec.structs.replace(final("r", ""), choices=[choice])


def test_a_choice_with_tool_calls_is_a_message_of_calls_finished_tool_calls():
    (choice,) = response_body(with_calls(), "chatcmpl-1", "chat.completions", 1)["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][1] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"i":1}'},
    }


def test_streamed_tool_calls_are_deltas_with_distinct_indices_then_the_finish():
    fmt = ChunkFormatter("chatcmpl-1", "chat.completions", "llmq-sim", 5, include_usage=False)
    *deltas, last = events(_finish_chunks(fmt, with_calls(), {}))
    calls = [d["choices"][0]["delta"]["tool_calls"][0] for d in deltas]
    assert [(c["index"], c["id"], c["function"]["arguments"]) for c in calls] == [
        (0, "call_0", '{"i":0}'),
        (1, "call_1", '{"i":1}'),
    ]
    assert last["choices"][0]["finish_reason"] == "tool_calls" and last["choices"][0]["delta"] == {}

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
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
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


# --- logprobs --------------------------------------------------------------------------------------------------------


def entry(token: bytes, logprob: float, *top: tuple[bytes, float]) -> wire.TokenLogprob:
    spell = lambda data: data.decode(errors="backslashreplace")  # noqa: E731
    return wire.TokenLogprob(
        token=spell(token),
        logprob=logprob,
        bytes=list(token),
        top_logprobs=[wire.TopLogprob(token=spell(t), logprob=lp, bytes=list(t)) for t, lp in top],
    )


# "é" split over two tokens, then " x"
ENTRIES = [
    entry(b"\xc3", -0.5, (b"\xc3", -0.5), (b"a", -1.5)),
    entry(b"\xa9", -0.1, (b"\xa9", -0.1)),
    entry(b" x", -2.0),
]


def with_logprobs(text: str, entries: list[wire.TokenLogprob]) -> wire.FinalResult:
    result = final("r", text)
    choice = msgspec.structs.replace(result.choices[0], logprobs=entries)
    return msgspec.structs.replace(result, choices=[choice])


def test_chat_logprobs_are_openais_content_entries():
    body = response_body(with_logprobs("é x", ENTRIES), "chatcmpl-1", "chat.completions", 1)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None
    assert logprobs["content"][0] == {
        "token": "\\xc3",
        "logprob": -0.5,
        "bytes": [0xC3],
        "top_logprobs": [
            {"token": "\\xc3", "logprob": -0.5, "bytes": [0xC3]},
            {"token": "a", "logprob": -1.5, "bytes": [97]},
        ],
    }
    assert [e["token"] for e in logprobs["content"]] == ["\\xc3", "\\xa9", " x"]


def test_completion_logprobs_are_the_legacy_four_lists_with_character_offsets():
    body = response_body(with_logprobs("é x", ENTRIES), "cmpl-1", "completions", 1)
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["\\xc3", "\\xa9", " x"],
        "token_logprobs": [-0.5, -0.1, -2.0],
        "top_logprobs": [{"\\xc3": -0.5, "a": -1.5}, {"\\xa9": -0.1}, {" x": -2.0}],  # the chosen one always in it
        "text_offset": [0, 0, 1],  # the second byte of é starts where é does
    }


@pytest.mark.parametrize("endpoint", ["chat.completions", "completions"])
def test_stream_chunks_carry_their_tokens_and_the_closing_one_the_rest(endpoint):
    whole = response_body(with_logprobs("é x", ENTRIES), "id", endpoint, 1)["choices"][0]["logprobs"]
    fmt = ChunkFormatter("id", endpoint, "llmq-sim", 5, include_usage=False)
    (first,) = events(fmt.text(0, "é", logprobs=ENTRIES[:2]))
    (last,) = events(_finish_chunks(fmt, with_logprobs("é x", ENTRIES), {0: "é"}))
    parts = [first["choices"][0]["logprobs"], last["choices"][0]["logprobs"]]
    if endpoint == "chat.completions":
        assert [e for p in parts for e in p["content"]] == whole["content"]
    else:
        assert {k: parts[0][k] + parts[1][k] for k in whole} == whole  # offsets go on from the first chunk


def test_without_logprobs_asked_every_shape_keeps_null():
    fmt = ChunkFormatter("id", "chat.completions", "llmq-sim", 5, include_usage=False)
    (chunk,) = events(fmt.text(0, "hi"))
    assert chunk["choices"][0]["logprobs"] is None
    assert response_body(final("r"), "id", "completions", 1)["choices"][0]["logprobs"] is None


def test_a_batch_output_line_and_an_api_shaped_kafka_reply_carry_the_logprobs_as_the_endpoint_does():
    from llmq_jobs.lines import output_line, reply_line

    result = with_logprobs("é x", ENTRIES)
    ok, line = output_line(result)
    assert ok and line == reply_line(result)
    assert line["response"]["body"] == response_body(result, result.request_id, result.endpoint, 0)
    assert line["response"]["body"]["choices"][0]["logprobs"]["tokens"] == ["\\xc3", "\\xa9", " x"]


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

"""What every SSE stream of the edge shares: no JSON it streams holds a byte any line splitter ends a line at (U+2028,
U+2029 and U+0085 went raw into data lines, and httpx's ``iter_lines`` cut the events there: issue 33 item 5)."""

import asyncio
import json

import pytest

from llmq_api import sse
from llmq_api.responses import StreamResponse
from tests.unit.api.fakes import final
from tests.unit.api.test_responses_shutdown import pending

SEPARATORS = "a\u2028b\u2029c\u0085d"


def test_data_json_escapes_the_line_separators_json_leaves_raw():
    data = sse.data_json({"text": SEPARATORS, "é": "\u2028"})
    assert data.decode().splitlines() == [data.decode()] and json.loads(data) == {"text": SEPARATORS, "é": "\u2028"}


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"model": "llmq-sim", "prompt": SEPARATORS, "max_tokens": 7, "stream": True}),
        (
            "/v1/chat/completions",
            {
                "model": "llmq-sim",
                "messages": [{"role": "user", "content": SEPARATORS}],
                "max_tokens": 7,
                "stream": True,
            },
        ),
        (
            "/v1/messages",
            {
                "model": "llmq-sim",
                "messages": [{"role": "user", "content": SEPARATORS}],
                "max_tokens": 7,
                "stream": True,
            },
        ),
    ],
)
async def test_every_streamed_event_survives_httpx_iter_lines(setup, path, body):
    client, *_ = setup
    headers = {"anthropic-version": "2023-06-01"} if path == "/v1/messages" else {}
    async with client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines()]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    assert data and all(line.startswith(("data: ", "event: ", ":")) or not line for line in lines), lines
    events = [json.loads(d) for d in data]  # each one whole
    streamed = json.dumps(events, ensure_ascii=False)
    assert "\u2028" in streamed and "\u2029" in streamed and "\u0085" in streamed  # the text itself arrives intact


async def test_a_silent_stream_gets_keep_alive_comments_and_none_after_its_end():
    """Before its first token (a long prompt's prefill) a stream gets an SSE comment per silent interval, so a load
    balancer's idle timeout does not cut it; the stream still ends with its text and [DONE]."""
    held, _ = pending(stream=True)
    sent: list[bytes] = []
    commented = asyncio.Event()

    async def receive():
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message.get("body", b""))
        if message.get("body", b"").startswith(b":"):
            commented.set()

    task = asyncio.create_task(StreamResponse(held, keep_alive_s=0.02)({"type": "http"}, receive, send))
    await asyncio.wait_for(commented.wait(), 5)
    held.registry.dispatch(final("r1", "abcd"))
    await asyncio.wait_for(task, 5)
    assert sent[1] == sse.KEEP_ALIVE_COMMENT  # after the headers, before any text
    events = b"".join(sent).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    text = "".join(c["text"] for e in events if e.startswith("data: {") for c in json.loads(e[6:])["choices"])
    assert text == "abcd"

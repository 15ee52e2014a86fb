"""StreamResponse: a client never receives text from two generations of its request."""

import asyncio
import json

import pytest

from llmq_api.responses import StreamResponse
from llmq_core import wire
from tests.unit.api.fakes import chunk, final
from tests.unit.api.test_responses_shutdown import pending


async def stream(messages: list[wire.TokenChunk | wire.FinalResult]) -> tuple[str, list[dict]]:
    """Serve one stream that receives ``messages``; returns its text and its error events (then checks [DONE])."""
    held, _ = pending(stream=True)
    sent: list[dict] = []

    async def receive():
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message)

    task = asyncio.create_task(StreamResponse(held)({"type": "http"}, receive, send))
    await asyncio.sleep(0)
    for message in messages:
        held.registry.dispatch(message)
    await asyncio.wait_for(task, 5)
    events = b"".join(m.get("body", b"") for m in sent).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and sent[-1]["more_body"] is False
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    text = "".join(c["text"] for p in payloads for c in p.get("choices", ()))
    return text, [p["error"] for p in payloads if "error" in p]


async def test_a_result_that_extends_the_text_sent_completes_it():
    text, errors = await stream([chunk("r1", "ab", 0), final("r1", "abcd")])
    assert (text, errors) == ("abcd", [])


@pytest.mark.parametrize(
    "rerun",
    [
        [chunk("r1", "XY", 0), chunk("r1", "ZW", 1)],  # the same attempt run again (a worker restarted)
        [chunk("r1", "XY", 0, attempt=1), chunk("r1", "ZW", 1, attempt=1)],  # re-dispatched
    ],
)
async def test_a_result_of_another_generation_ends_the_stream_with_stream_interrupted(rerun):
    text, errors = await stream([chunk("r1", "ab", 0), chunk("r1", "cd", 1), *rerun, final("r1", "XYZW")])
    assert text == "abcd"
    assert errors == [
        {"message": errors[0]["message"], "type": "server_error", "param": None, "code": "stream_interrupted"}
    ]


async def test_the_worker_s_stream_interrupted_result_ends_the_stream_with_its_error():
    error = wire.ErrorInfo(
        type="server_error", message="interrupted after 2 tokens", code="stream_interrupted", retryable=True
    )
    result = final("r1", "", outcome=wire.Outcome.ERRORED, error=error)
    text, errors = await stream([chunk("r1", "ab", 0), result])
    assert text == "ab"
    assert errors == [
        {"message": "interrupted after 2 tokens", "type": "server_error", "param": None, "code": "stream_interrupted"}
    ]

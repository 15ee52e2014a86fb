"""Resumable streams at the edge: the events' ids and what a resumed stream skips (StreamEvents), and when a holder's
leaving cancels its stream (StreamHolds)."""

from __future__ import annotations

import asyncio

import pytest

from llmq_api.exchange import CLIENT_GONE_REASON, DEADLINE_REASON, SHUTDOWN_REASON
from llmq_api.resume import FIRST, StreamHolds
from llmq_api.stream_events import StreamEvents, with_id
from llmq_core import constants, wire
from tests.fakes import FakeRedis
from tests.unit.api.fakes import CancelRecorder


def encode(index: int, text: str, logprobs=None) -> bytes:
    return f"data: {index}:{text}\n\n".encode() if text else b""


def result(*texts: str) -> wire.FinalResult:
    return wire.FinalResult(
        request_id="r",
        outcome=wire.Outcome.SUCCEEDED,
        model="m",
        reply_to=wire.HttpReply(instance_id="pod"),
        choices=[wire.Choice(index=i, text=t, finish_reason="length") for i, t in enumerate(texts)],
        usage=wire.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )


def test_the_id_goes_on_the_last_event_of_what_is_written():
    assert with_id(b"data: a\n\n", 3) == b"id: 3\ndata: a\n\n"
    assert (
        with_id(b"event: x\ndata: a\n\nevent: y\ndata: b\n\n", 7)
        == b"event: x\ndata: a\n\nid: 7\nevent: y\ndata: b\n\n"
    )


def test_ids_count_the_characters_of_text_over_all_choices():
    events = StreamEvents(encode)
    assert events.opening(b"data: role\n\n") == b"id: 0\ndata: role\n\n"
    assert events.text(0, "ab") == b"id: 2\ndata: 0:ab\n\n"
    assert events.text(1, "xyz") == b"id: 5\ndata: 1:xyz\n\n"
    assert events.closing(b"data: [DONE]\n\n", result("ab!", "xyz")) == b"id: 6\ndata: [DONE]\n\n"


def test_a_resumed_stream_writes_only_the_text_after_its_last_event_id_splitting_a_chunk_that_straddles_it():
    events = StreamEvents(encode, last_event_id=3)
    assert events.opening(b"data: role\n\n") == b""  # the client has it
    assert events.text(0, "ab") == b""
    assert events.text(0, "cde") == b"id: 5\ndata: 0:de\n\n"  # "c" was the client's (id 3)
    assert events.sent == {0: "abcde"} and events.written


def test_a_stream_without_ids_writes_what_the_dialect_wrote():
    events = StreamEvents(encode, ids=False)
    assert events.opening(b"data: role\n\n") == b"data: role\n\n" and events.text(0, "ab") == b"data: 0:ab\n\n"


def test_text_the_dialect_holds_back_is_not_counted_as_sent():
    events = StreamEvents(lambda index, text, logprobs=None: b"", last_event_id=0)
    assert events.text(0, "call") == b"" and events.sent == {} and not events.written


def test_a_log_that_kept_less_than_the_resumed_id_is_caught_up_from_the_result_of_one_choice():
    events = StreamEvents(encode, last_event_id=4)
    events.text(0, "ab")  # the log ended here (its bound); the client had "abcd"
    assert events.catch_up(result("abcdef")) and events.sent == {0: "abcd"}


def test_of_several_choices_it_is_not_known_which_text_the_client_had():
    events = StreamEvents(encode, last_event_id=4)
    events.text(0, "ab")
    assert not events.catch_up(result("abcd", "xy"))


class Sleeps:
    """A sleep the test releases by hand."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future] = []

    async def __call__(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        await future

    async def end(self) -> None:
        while not self.waiting:
            await asyncio.sleep(0)
        for future in self.waiting:
            future.set_result(None)
        self.waiting.clear()
        for _ in range(5):
            await asyncio.sleep(0)


@pytest.fixture
def holds():
    redis, cancels, sleeps, released = FakeRedis(), CancelRecorder(), Sleeps(), []
    holds = StreamHolds(redis, "pod-a", 10_000, cancels, sleep=sleeps)

    async def release() -> None:
        released.append(True)

    return holds, redis, cancels, sleeps, released, release


async def test_a_stream_whose_client_left_is_cancelled_after_the_window_unless_resumed(holds):
    holds, redis, cancels, sleeps, released, release = holds
    await holds.canceller(FIRST, release)("r1", CLIENT_GONE_REASON)
    await holds.canceller(FIRST, release)("r2", CLIENT_GONE_REASON)
    other = StreamHolds(redis, "pod-b", 10_000, cancels)
    await other.take("r2", 60_000)  # resumed at pod-b within the window
    assert cancels.cancels == []
    await sleeps.end()
    assert cancels.cancels == [("r1", CLIENT_GONE_REASON)] and released == [True]


async def test_a_resuming_connection_that_leaves_cancels_only_while_it_still_holds_the_stream(holds):
    holds, redis, cancels, sleeps, released, release = holds
    mine = await holds.take("r", 60_000)
    await holds.canceller(mine, release)("r", CLIENT_GONE_REASON)
    await sleeps.end()
    assert cancels.cancels == [("r", CLIENT_GONE_REASON)]
    again = await holds.take("r", 60_000)
    await holds.canceller(mine, release)("r", CLIENT_GONE_REASON)  # a stale connection: another took it since
    await sleeps.end()
    assert len(cancels.cancels) == 1 and redis.data[constants.stream_holder_key("r")].endswith(again.encode())


async def test_a_deadline_cancels_at_once_and_a_shutdown_leaves_it_to_the_batchers(holds):
    holds, _, cancels, sleeps, released, release = holds
    await holds.canceller(FIRST, release)("r1", DEADLINE_REASON)
    await holds.canceller(FIRST, release)("r2", SHUTDOWN_REASON)
    assert cancels.cancels == [("r1", DEADLINE_REASON)] and released == [True] and sleeps.waiting == []


async def test_stop_ends_the_windows_being_waited_out(holds):
    holds, _, cancels, sleeps, _, release = holds
    await holds.canceller(FIRST, release)("r", CLIENT_GONE_REASON)
    while not sleeps.waiting:
        await asyncio.sleep(0)
    await holds.stop()
    assert cancels.cancels == [] and sleeps.waiting[0].cancelled()


async def test_a_stream_that_ended_within_the_window_is_neither_cancelled_nor_freed(holds):
    holds, redis, cancels, sleeps, released, release = holds
    await holds.canceller(FIRST, release)("r", CLIENT_GONE_REASON)
    redis.data[constants.result_key("r")] = b"stored"  # the result-router stored its result
    await sleeps.end()
    assert cancels.cancels == [] and released == []  # a retry with its key gets that result

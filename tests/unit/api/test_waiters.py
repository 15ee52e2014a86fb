"""WaiterRegistry: each waiter gets exactly one resolution; stray and late replies are dropped."""

import pytest

from llmq_api.waiters import Abandoned, DeadlineExceeded, DuplicateRequestError, WaiterRegistry
from tests.unit.api.fakes import chunk, final


async def test_result_resolves_and_unregisters():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=False)
    result = final("r1")
    assert registry.dispatch(result)
    assert waiter.resolution is result and "r1" not in registry and len(registry) == 0
    assert await waiter.next_event() is result


async def test_first_resolution_wins_result_then_deadline():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=False)
    result = final("r1")
    registry.dispatch(result)
    assert registry.resolve(waiter, DeadlineExceeded()) is result
    assert registry.resolve(waiter, Abandoned("client_disconnected")) is result
    assert waiter._events.qsize() == 1


async def test_deadline_then_late_result_is_dropped():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=False)
    assert registry.resolve(waiter, DeadlineExceeded()) == DeadlineExceeded()
    assert not registry.dispatch(final("r1"))
    assert registry.dropped == 1
    assert waiter.resolution == DeadlineExceeded() and waiter._events.qsize() == 1


async def test_cancel_then_late_chunk_and_result_are_dropped():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    registry.resolve(waiter, Abandoned("client_disconnected"))
    assert not registry.dispatch(chunk("r1", "x", 0))
    assert not registry.dispatch(final("r1"))
    assert await waiter.next_event() == Abandoned("client_disconnected")
    assert registry.dropped == 2


async def test_unknown_request_is_dropped():
    registry = WaiterRegistry(10)
    mine = registry.register("mine", stream=True)
    assert not registry.dispatch(final("someone-else"))
    assert not registry.dispatch(chunk("someone-else", "x", 0))
    assert mine.resolution is None and mine._events.empty()


async def test_stream_chunks_in_order_then_result():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    for seq, text in [(0, "a"), (1, "b"), (2, "c")]:
        registry.dispatch(chunk("r1", text, seq, attempt=3))
    registry.dispatch(final("r1", "abc"))
    events = [await waiter.next_event() for _ in range(4)]
    assert [e.text for e in events[:3]] == ["a", "b", "c"] and waiter.attempt == 3
    assert events[3].choices[0].text == "abc"


@pytest.mark.parametrize(
    "intruder",
    [
        chunk("r1", "X", 2, attempt=1),  # another attempt, in sequence
        chunk("r1", "X", 0),  # the same attempt run again from its start
        chunk("r1", "b", 1),
    ],
)  # a repeat
async def test_after_a_chunk_of_another_generation_no_chunk_passes(intruder):
    """A worker killed mid-stream and restarted runs the request again: its chunks start at seq 0, and the one that
    carries the next seq of the first run must not pass either (the client got the first run's head + its tail)."""
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    assert registry.dispatch(chunk("r1", "a", 0)) and registry.dispatch(chunk("r1", "b", 1))
    assert not registry.dispatch(intruder)
    assert not any(
        registry.dispatch(chunk("r1", t, s, attempt=a)) for s, t, a in [(2, "c", 0), (2, "Y", 1), (3, "Z", 1)]
    )
    registry.dispatch(final("r1", "abc"))
    events = [await waiter.next_event() for _ in range(3)]
    assert [e.text for e in events[:2]] == ["a", "b"] and events[2].choices[0].text == "abc"


async def test_a_first_chunk_that_never_passed_binds_nothing():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    assert not registry.dispatch(chunk("r1", "lost-head", 1))  # seq 0 was lost: the text comes from the result
    assert registry.dispatch(chunk("r1", "a", 0, attempt=1))  # a re-run from the start: nothing of the first went out
    assert waiter.attempt == 1


async def test_chunks_after_a_lost_chunk_are_dropped_the_result_brings_the_rest():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    for seq, text in [(0, "a"), (2, "c"), (3, "d")]:  # seq 1 was lost while Redis restarted
        registry.dispatch(chunk("r1", text, seq))
    registry.dispatch(final("r1", "abcd"))
    events = [await waiter.next_event() for _ in range(2)]
    assert events[0].text == "a"
    assert events[1].choices[0].text == "abcd"


async def test_a_continued_attempt_joins_the_stream_after_the_text_the_client_has():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    for seq, text, offset in [(0, "hel", 0), (1, "lo", 3)]:
        assert registry.dispatch(chunk("r1", text, seq, offset=offset))
    # its worker was lost; the next one replays the tokens it had (more than the client got: " w" was held back)
    assert registry.dispatch(chunk("r1", "hello w", 0, attempt=1, offset=0))
    assert not registry.dispatch(chunk("r1", "!", 2, offset=5))  # the lost attempt's late chunk: dropped
    assert registry.dispatch(chunk("r1", "orld", 1, attempt=1, offset=7))
    assert registry.dispatch(chunk("r1", "x", 2, index=1, attempt=1, offset=0))  # seq counts every choice's chunks
    registry.dispatch(final("r1", "hello world"))
    events = [await waiter.next_event() for _ in range(6)]
    assert [(e.index, e.text) for e in events[:5]] == [(0, "hel"), (0, "lo"), (0, " w"), (0, "orld"), (1, "x")]
    assert waiter.attempt == 1 and events[5].choices[0].text == "hello world"


async def test_a_restarted_worker_continues_the_same_attempt():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    assert registry.dispatch(chunk("r1", "ab", 0, offset=0)) and registry.dispatch(chunk("r1", "c", 1, offset=2))
    assert registry.dispatch(chunk("r1", "abc", 0, offset=0))  # attempt 0 again: its worker's next process
    assert registry.dispatch(chunk("r1", "d", 1, offset=3))
    registry.dispatch(final("r1", "abcd"))
    events = [await waiter.next_event() for _ in range(4)]
    assert [e.text for e in events[:3]] == ["ab", "c", "d"] and waiter.attempt == 0


async def test_a_replay_that_only_restates_the_clients_text_adds_nothing():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    assert registry.dispatch(chunk("r1", "abc", 0, offset=0))
    assert registry.dispatch(chunk("r1", "ab", 0, attempt=1, offset=0))  # the frames held less: nothing new
    assert registry.dispatch(chunk("r1", "cd", 1, attempt=1, offset=2))  # overlaps the client's "c"
    registry.dispatch(final("r1", "abcd"))
    events = [await waiter.next_event() for _ in range(3)]
    assert [e.text for e in events[:2]] == ["abc", "d"]


@pytest.mark.parametrize(
    "joining",
    [
        chunk("r1", "hexyz", 0, attempt=1, offset=0),  # not the client's text
        chunk("r1", "rld", 0, attempt=1, offset=8),  # past what the client has: a gap
        chunk("r1", "hello", 0, attempt=1),  # no offset (a worker from before continuations): a run from its start
    ],
)
async def test_a_later_attempt_that_cannot_join_stops_the_stream_and_the_result_decides(joining):
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    assert registry.dispatch(chunk("r1", "hello", 0, offset=0))
    assert not registry.dispatch(joining)
    assert not registry.dispatch(chunk("r1", "more", 1, attempt=1, offset=len(joining.text)))
    registry.dispatch(final("r1", "hello world"))
    events = [await waiter.next_event() for _ in range(2)]
    assert events[0].text == "hello" and events[1].choices[0].text == "hello world"


async def test_chunks_for_non_streaming_waiters_are_dropped():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=False)
    assert not registry.dispatch(chunk("r1", "a", 0))
    assert waiter._events.empty()


def test_duplicate_registration_raises_and_capacity_is_reported():
    registry = WaiterRegistry(2)
    registry.register("a", stream=False)
    with pytest.raises(DuplicateRequestError):
        registry.register("a", stream=False)
    assert not registry.full
    registry.register("b", stream=False)
    assert registry.full and sorted(registry.request_ids()) == ["a", "b"]

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


async def test_stream_chunks_in_order_duplicates_dropped_then_result():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    for seq, text in [(0, "a"), (1, "b"), (1, "b"), (0, "a"), (2, "c")]:
        registry.dispatch(chunk("r1", text, seq))
    registry.dispatch(final("r1", "abc"))
    events = [await waiter.next_event() for _ in range(4)]
    assert [e.text for e in events[:3]] == ["a", "b", "c"]
    assert events[3].choices[0].text == "abc"


async def test_chunks_after_a_lost_chunk_are_dropped_the_result_brings_the_rest():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True)
    for seq, text in [(0, "a"), (2, "c"), (3, "d")]:  # seq 1 was lost while Redis restarted
        registry.dispatch(chunk("r1", text, seq))
    registry.dispatch(final("r1", "abcd"))
    events = [await waiter.next_event() for _ in range(2)]
    assert events[0].text == "a"
    assert events[1].choices[0].text == "abcd"


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

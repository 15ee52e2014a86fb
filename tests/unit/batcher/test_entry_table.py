"""The entry table: the one place an entry's state changes, and the counts it keeps."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmq_batcher.entries import Entry, EntryState, EntryTable, Flight
from tests.unit.batcher.helpers import counts, recount, req

NEW, QUEUED, DISPATCHED, DONE = EntryState.NEW, EntryState.QUEUED, EntryState.DISPATCHED, EntryState.DONE
TENANTS = ("t0", "t1")


def entry(request_id: str, tenant: str = "t0") -> Entry:
    return Entry(req(request_id, tenant=tenant), seq=0, cls=0, cost=1, size_bytes=1, enqueued_ms=0)


def test_a_request_moves_from_queued_through_dispatched_to_done_and_is_counted_on_the_way():
    table, flight = EntryTable(), Flight("w1")
    a, b = entry("a"), entry("b", "t1")
    for e in (a, b):
        table.transition(e, QUEUED)
    assert (table.queued, table.inflight, table.live_flights) == (2, 0, 0)
    assert table.get("a") is a and "b" in table
    for e in (a, b):
        table.transition(e, DISPATCHED, flight)
    assert (table.queued, table.inflight, table.live_flights) == (0, 2, 1)
    assert (table.tenant_inflight("t0"), table.tenant_inflight("t1")) == (1, 1)
    assert (a.flight, flight.entries, flight.live) == (flight, [a, b], 2)
    table.transition(a, DONE)
    assert (table.inflight, table.live_flights, table.tenant_inflight("t0"), "a" in table) == (1, 1, 0, False)
    table.transition(b, DONE)
    assert (table.inflight, table.live_flights, flight.entries) == (0, 0, None)


def test_a_queued_request_leaves_without_dispatch():
    table = EntryTable()
    a = entry("a")
    table.transition(a, QUEUED)
    table.transition(a, DONE)
    assert (table.queued, a.state, table.get("a")) == (0, DONE, None)


@pytest.mark.parametrize(
    "path, move",
    [
        ([], DISPATCHED),  # never queued
        ([], DONE),
        ([QUEUED], QUEUED),
        ([QUEUED], NEW),
        ([QUEUED, DISPATCHED], QUEUED),  # a re-queue is a new entry
        ([QUEUED, DISPATCHED], DISPATCHED),
        ([QUEUED, DONE], QUEUED),
        ([QUEUED, DONE], DONE),
    ],
)
def test_any_other_move_is_refused_and_changes_nothing(path, move):
    table, flight = EntryTable(), Flight("w1")
    a = entry("a")
    for state in path:
        table.transition(a, state, flight)
    before = (a.state, counts(table, TENANTS), flight.live)
    with pytest.raises(ValueError, match="no move from"):
        table.transition(a, move, flight)
    assert (a.state, counts(table, TENANTS), flight.live) == before


def test_a_second_entry_for_a_held_request_id_is_refused():
    table = EntryTable()
    table.transition(entry("a"), QUEUED)
    with pytest.raises(ValueError):
        table.transition(entry("a"), QUEUED)
    assert table.queued == 1


def test_dispatch_needs_a_flight():
    table = EntryTable()
    a = entry("a")
    table.transition(a, QUEUED)
    with pytest.raises(ValueError):
        table.transition(a, DISPATCHED)
    assert (a.state, table.queued, table.inflight) == (QUEUED, 1, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from((QUEUED, DISPATCHED, DONE)), st.integers(0, 2)),
        max_size=60,
    )
)
def test_the_counts_always_equal_a_recount(moves):
    """Random moves, legal or not, of six requests of two tenants in three flights: after each one the table's counts
    are what its entries say; a finished request comes back as a new entry."""
    table = EntryTable()
    flights = [Flight(f"w{i}") for i in range(3)]
    entries = [entry(f"r{i}", TENANTS[i % 2]) for i in range(6)]
    for index, state, flight in moves:
        if entries[index].state is DONE:
            entries[index] = entry(f"r{index}", TENANTS[index % 2])
        if flights[flight].entries is None:  # landed: the policy dispatches a new batch in a new flight
            flights[flight] = Flight(f"w{flight}")
        try:
            table.transition(entries[index], state, flights[flight])
        except ValueError:
            pass
        assert counts(table, TENANTS) == recount(table)
        assert all(f.live == sum(e.flight is f for e in table.held()) for f in flights)

"""Preemption, the batcher's side: when no worker of a model has free slots, interactive and near-interactive batches
go into a continuous-batching worker's preemptible room (the running deferred sequences it reports it would preempt),
never deferred ones; and the capacity ledger's rule for such room (llmq_batcher.ledger)."""

from __future__ import annotations

from llmq_batcher.ledger import Grant, WorkerLedger
from llmq_batcher.workers import WorkerPool, WorkerView
from llmq_core import wire
from llmq_core.metrics import BatcherMetrics
from tests.fakes import Record
from tests.unit.batcher.helpers import INTERACTIVE, MODEL, NAMES, T0, dispatched_ids, hb, make_loop, make_policy, req

TTL_MS = 2_000


def full_worker(policy, worker_id: str = "w1", preemptible: int = 2, **fields) -> None:
    """A continuous-batching worker of 8 slots, all running, ``preemptible`` of them deferred ones it would preempt."""
    policy.on_heartbeat(hb(worker_id, free=0, preemptible=preemptible, **fields), T0)


def test_a_full_worker_takes_interactive_work_into_its_preemptible_room_and_no_more():
    policy, _ = make_policy()
    full_worker(policy)
    for i in range(5):
        policy.add(req(f"p{i}"), T0)
    decision = policy.schedule(T0)
    assert dispatched_ids(decision) == [["p0", "p1"]]
    (batch,) = decision.batches
    assert (batch.worker_id, batch.flush_reason, batch.preempting) == ("w1", "size", True)
    assert policy.queued_total == 3


def test_deferred_work_never_goes_into_preemptible_room():
    policy, clock = make_policy()
    full_worker(policy)
    for i in range(3):
        policy.add(req(f"d{i}", "deferred"), T0)
    clock.advance(1_000)  # past the deferred window
    assert policy.schedule(clock.now_ms(), drain=True).batches == []
    policy.add(req("n0", "near", now_ms=clock.now_ms()), clock.now_ms())
    assert dispatched_ids(policy.schedule(clock.now_ms(), drain=True)) == [["n0"]]  # deferred does not ride along


def test_a_worker_with_free_slots_is_chosen_before_preemptible_room():
    policy, _ = make_policy()
    full_worker(policy, "w1")
    policy.on_heartbeat(hb("w2", free=3), T0)
    for i in range(5):
        policy.add(req(f"p{i}"), T0)
    decision = policy.schedule(T0)
    assert [(b.worker_id, b.preempting, [r.request_id for r in b.requests]) for b in decision.batches] == [
        ("w2", False, ["p0", "p1", "p2"]),  # the free slots first, as before
        ("w1", True, ["p3", "p4"]),  # then, with none left, the preemptible room
    ]


def test_the_worker_with_most_preemptible_room_is_chosen():
    policy, _ = make_policy()
    full_worker(policy, "w1", preemptible=1)
    full_worker(policy, "w2", preemptible=3)
    policy.add(req("p0"), T0)
    policy.add(req("p1"), T0)
    assert [(b.worker_id, len(b.requests)) for b in policy.schedule(T0, drain=True).batches] == [("w2", 2)]


def test_batches_sent_since_the_heartbeat_count_against_the_preemptible_room():
    policy, _ = make_policy()
    full_worker(policy)
    policy.add(req("p0"), T0)
    assert dispatched_ids(policy.schedule(T0, drain=True)) == [["p0"]]
    policy.add(req("p1"), T0)
    policy.add(req("p2"), T0)
    decision = policy.schedule(T0, drain=True)
    assert dispatched_ids(decision) == [["p1"]]  # 2 preemptible, 1 already sent
    assert policy.schedule(T0, drain=True).batches == []  # nothing beyond free + preemptible
    # the worker took both batches and preempted for them: it reports no preemptible room now
    policy.on_heartbeat(hb("w1", free=0, last_batch_id=decision.batches[0].batch_id), T0)
    assert policy.schedule(T0, drain=True).batches == [] and policy.queued_total == 1


def test_a_heartbeat_that_frees_slots_counts_them_before_the_preemptible_room():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=1, preemptible=2), T0)
    for i in range(4):
        policy.add(req(f"p{i}"), T0)
    decision = policy.schedule(T0, drain=True)
    assert [(b.preempting, len(b.requests)) for b in decision.batches] == [(False, 1), (True, 2)]
    assert policy.queued_total == 1


def test_a_batch_into_preemptible_room_waits_its_window_as_any_other():
    policy, clock = make_policy()
    full_worker(policy)
    policy.add(req("n0", "near"), T0)
    decision = policy.schedule(T0)
    assert decision.batches == [] and decision.next_wake_ms is not None and decision.next_wake_ms > T0
    clock.set(decision.next_wake_ms)
    (batch,) = policy.schedule(clock.now_ms()).batches
    assert (batch.flush_reason, batch.preempting, [r.request_id for r in batch.requests]) == ("wait", True, ["n0"])


def test_a_fixed_time_worker_is_never_chosen_for_preemptible_room():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=0, fixed_ms=500, est_drain_ms=300, preemptible=4), T0)
    policy.add(req("p0"), T0)
    assert policy.schedule(T0, drain=True).batches == []
    view = WorkerView(hb("w1", free=0, fixed_ms=500, preemptible=4))
    view.apply_heartbeat(hb("w1", free=0, fixed_ms=500, preemptible=4), T0, 10_000)
    pool = WorkerPool()
    pool.add(view)
    assert view.preemptible_room() == 0 and pool.most_preemptible() is None


def test_a_heartbeat_without_preemptible_reads_zero():
    beat = wire.decode(wire.encode(hb("w1", free=0)))
    assert beat.preemptible == 0
    policy, _ = make_policy()
    policy.on_heartbeat(beat, T0)
    policy.add(req("p0"), T0)
    assert policy.schedule(T0, drain=True).batches == []


def test_a_batch_is_urgent_only_without_deferred_requests():
    policy, clock = make_policy(deferred_reserved_share=0)
    policy.on_heartbeat(hb("w1", free=8), T0)
    policy.add(req("p0"), T0)
    (interactive,) = policy.schedule(T0).batches
    policy.add(req("d0", "deferred"), T0)
    clock.advance(1_000)
    (deferred,) = policy.schedule(clock.now_ms(), drain=True).batches
    assert (interactive.urgent(), deferred.urgent()) == (True, False)


# --- the capacity ledger ---------------------------------------------------------------------------------------------


def test_the_ledger_grants_preemptible_room_to_urgent_batches_only():
    ledger = WorkerLedger(max_slots=8, fixed=False, queue_bound=0, running=8, preemptible=2)
    assert ledger.claim("d", 3, T0, TTL_MS) == Grant(0)  # a batch with deferred requests: today's room, none
    assert ledger.claim("u1", 3, T0, TTL_MS, urgent=True) == Grant(2)
    assert ledger.claim("u2", 1, T0, TTL_MS, urgent=True) == Grant(0)  # handed out once
    ledger.took("u1", running=8, queued=2, preemptible=2)  # queued behind the preemption it asked for
    assert ledger.room(T0, urgent=True) == 0
    ledger.holds(running=8, queued=0, preemptible=1)
    assert (ledger.room(T0), ledger.room(T0, urgent=True)) == (0, 1)


def test_a_fixed_time_ledger_ignores_urgency():
    ledger = WorkerLedger(max_slots=8, fixed=True, batch_time_ms=500, queued=8, preemptible=4)
    assert ledger.room(T0, urgent=True) == ledger.room(T0) == 0


# --- the metric ------------------------------------------------------------------------------------------------------


async def test_batches_into_preemptible_room_are_counted():
    loop, _, producer, _ = make_loop(metrics=BatcherMetrics())
    loop.policy.on_heartbeat(hb("w1", free=1, preemptible=2), loop.clock.now_ms())
    for offset in range(3):
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(req(f"p{offset}"))))
    await loop.step(drain=True)
    assert [len(wire.decode(s["value"]).requests) for s in producer.on(NAMES.batches_topic)] == [1, 2]
    value = loop.metrics.registry.get_sample_value
    assert value("llmq_batcher_preempting_dispatches_total", {"model": MODEL}) == 1
    assert value("llmq_batcher_flushes_total", {"model": MODEL, "reason": "drain"}) == 2

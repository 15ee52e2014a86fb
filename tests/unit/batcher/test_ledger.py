"""Several batchers as one scheduler (issue 28): the capacity ledger's rules (llmq_batcher.ledger), the class leads
before a fixed-time worker's window (workers.LeadSteps, WorkerView), and the policy following the ledger's grants."""

from __future__ import annotations

import pytest

from llmq_batcher.ledger import Grant, WorkerLedger
from llmq_batcher.workers import LeadSteps, WorkerView
from tests.unit.batcher.helpers import T0, hb, make_policy, req

TTL_MS = 2_000
LEADS = (40, 30, 20, 10)


def fixed_ledger(**fields) -> WorkerLedger:
    return WorkerLedger(max_slots=64, fixed=True, batch_time_ms=500, **fields)


def test_a_continuous_workers_room_is_its_slots_and_queue_bound_less_what_it_holds_and_what_is_in_transit():
    ledger = WorkerLedger(max_slots=8, fixed=False, queue_bound=4, running=6, queued=2)
    assert ledger.claim("b1", 3, T0, TTL_MS) == Grant(3)
    assert ledger.claim("b2", 3, T0, TTL_MS) == Grant(1)  # over-handout: never
    ledger.took("b1", running=8, queued=3)  # b1's grant is no longer in transit: the worker counts it
    assert ledger.room(T0) == 0
    ledger.holds(running=4, queued=0)
    assert ledger.room(T0) == 7  # 12 - 4 - b2's 1 in transit


def test_a_grant_whose_batch_never_arrives_stops_counting_after_its_ttl_or_when_released():
    ledger = WorkerLedger(max_slots=8, fixed=False)
    ledger.claim("lost", 5, T0, TTL_MS)  # a batcher killed between its claim and its produce
    ledger.claim("refused", 2, T0, TTL_MS)
    ledger.release("refused")
    assert ledger.room(T0 + TTL_MS - 1) == 3
    assert ledger.room(T0 + TTL_MS) == 8


def test_a_claim_on_an_idle_fixed_worker_starts_a_window_and_the_next_waits_for_its_lead():
    ledger = fixed_ledger()
    assert ledger.claim("a", 10, T0, TTL_MS, lead_ms=40, margin_ms=5) == Grant(10, T0 + 500, 64)
    # another batcher, a moment later: its batch would queue behind the window the first one starts
    assert ledger.claim("b", 10, T0 + 1, TTL_MS, lead_ms=40, margin_ms=5) == Grant(0, T0 + 500, 54)
    ledger.took("a", running=10, queued=0)
    ledger.holds(running=10, queued=0, ends_ms=T0 + 500)
    assert ledger.claim("b", 40, T0 + 460, TTL_MS, lead_ms=40, margin_ms=5) == Grant(40, T0 + 500, 24)
    assert ledger.claim("c", 30, T0 + 470, TTL_MS, lead_ms=40, margin_ms=5) == Grant(24, T0 + 1000, 64)
    assert ledger.claim("d", 5, T0 + 480, TTL_MS, lead_ms=40, margin_ms=5) == Grant(0, T0 + 1000, 64)


def test_a_claim_too_late_for_the_next_window_is_told_the_window_after():
    ledger = fixed_ledger(running=64, ends_ms=T0 + 500)
    assert ledger.claim("late", 8, T0 + 497, TTL_MS, lead_ms=40, margin_ms=5) == Grant(0, T0 + 1000, 64)


def test_lead_steps_open_the_classes_in_precedence_before_the_window():
    steps = LeadSteps(LEADS)
    assert [steps.begun(ahead) for ahead in (50, 40, 35, 30, 11, 10, 0)] == [0, 1, 1, 2, 3, 4, 4]
    assert [steps.lead_after(n) for n in range(5)] == [40, 30, 20, 10, None]


def busy_fixed_worker(leads=LEADS) -> WorkerView:
    """A fixed-time worker of 64 per 500 ms, 300 ms into a window, nothing queued: its next window at T0 + 200."""
    worker = WorkerView(hb("w1", free=0, max_slots=64, fixed_ms=500), LeadSteps(leads))
    worker.apply_heartbeat(hb("w1", free=0, max_slots=64, fixed_ms=500, est_drain_ms=200), T0, 10_000)
    return worker


def test_a_fixed_workers_next_window_opens_class_by_class_and_batches_sent_ahead_share_it():
    worker = busy_fixed_worker()
    assert (worker.busy_until_ms, worker.window_room) == (T0 + 200, 64)
    assert worker.heap_key()[0] == T0 + 160  # the first lead
    assert [worker.open_classes(T0 + at) for at in (150, 160, 175, 185, 195, 200)] == [0, 1, 2, 3, 4, 1 << 30]
    worker.record_dispatch("b1", [], T0 + 160)  # (an empty list stands for a batch of no requests)
    assert worker.phase == 1 and worker.window_room == 64
    worker.follow(T0 + 200, 20)  # the ledger: other batchers took 44 of the window
    assert (worker.busy_until_ms, worker.window_room, worker.phase) == (T0 + 200, 20, 1)
    worker.follow(T0 + 700, 64)  # ... and then the rest
    assert (worker.busy_until_ms, worker.window_room, worker.phase) == (T0 + 700, 64, 0)


def test_without_leads_a_fixed_worker_takes_its_next_batch_when_its_work_drains():
    worker = busy_fixed_worker(leads=())
    assert worker.open_classes(T0 + 199) == 0 and worker.free_slots(T0 + 200) == 64


@pytest.mark.parametrize("granted", [3, 2, 0])
def test_the_policy_sends_what_the_ledger_granted_and_requeues_the_rest_in_order(granted):
    policy, clock = make_policy(fixed_engine_max_wait_ms=0)
    policy.on_heartbeat(hb("w1", free=64, max_slots=64, fixed_ms=500), clock.now_ms())
    for i in range(3):
        policy.add(req(f"r{i}"), clock.now_ms())
    (batch,) = policy.schedule(clock.now_ms()).batches
    kept = policy.claimed(batch, Grant(granted, T0 + 500, 64))
    assert (0 if kept is None else len(kept.requests)) == granted
    assert policy.inflight_total == granted and policy.queued_total == 3 - granted
    clock.advance(500)
    policy.on_heartbeat(hb("w1", free=64, max_slots=64, fixed_ms=500, last_batch_id=batch.batch_id), clock.now_ms())
    later = policy.schedule(clock.now_ms()).batches
    assert [r.request_id for b in later for r in b.requests] == [f"r{i}" for i in range(granted, 3)]
    assert all(r.attempt == 0 for b in later for r in b.requests)  # never sent: not a new attempt

"""The batching policy, rule by rule, on a FakeClock (no sleeps)."""

import pytest

from llmq_batcher.policy import AddStatus, PolicyConfig, class_index, estimated_tokens
from llmq_core import wire
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode
from tests.unit.batcher.helpers import MODEL, T0, dispatched_ids, entry_bytes, hb, make_policy, req

# --- classes and precedence ------------------------------------------------------------------------------------------


def test_interactive_goes_out_at_once_to_a_continuous_worker():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w3", free=8), T0)
    policy.add(req("r1"), T0)
    decision = policy.schedule(T0)
    assert dispatched_ids(decision) == [["r1"]]
    batch = decision.batches[0]
    assert (batch.worker_id, batch.partition, batch.model, batch.flush_reason) == ("w3", 3, MODEL, "wait")


@pytest.mark.parametrize(
    "queued, free, expected",
    [
        # capacity short: strictly paid, then free, then near_interactive
        ([("d1", "deferred"), ("n1", "near"), ("f1", "free"), ("p1", "paid")], 1, ["p1"]),
        ([("d1", "deferred"), ("n1", "near"), ("f1", "free"), ("p1", "paid")], 2, ["p1", "f1"]),
        ([("n1", "near"), ("f1", "free"), ("p1", "paid"), ("p2", "paid")], 3, ["p1", "p2", "f1"]),
        # enough room: everything rides along, deferred only into slots above the reserve
        ([("d1", "deferred"), ("n1", "near"), ("p1", "paid")], 8, ["p1", "n1", "d1"]),
        ([("d1", "deferred"), ("d2", "deferred"), ("p1", "paid"), ("p2", "paid")], 5, ["p1", "p2", "d1"]),
        ([("d1", "deferred"), ("p1", "paid"), ("p2", "paid")], 4, ["p1", "p2"]),  # 2 left = the reserve of 8 slots
    ],
)
def test_strict_precedence_when_capacity_is_short(queued, free, expected):
    policy, _ = make_policy()
    for request_id, cls in queued:
        policy.add(req(request_id, cls), T0)
    policy.on_heartbeat(hb("w1", free=free), T0)
    assert dispatched_ids(policy.schedule(T0)) == [expected]


@pytest.mark.parametrize(
    "free, max_slots, deferred_queued, expected_size",
    [
        (8, 8, 10, 6),  # 25% of 8 slots stay free
        (4, 8, 10, 2),
        (2, 8, 10, 0),  # only reserved slots left: nothing
        (16, 16, 3, 3),
    ],
)
def test_deferred_never_fills_the_reserved_slots(free, max_slots, deferred_queued, expected_size):
    policy, clock = make_policy()
    for i in range(deferred_queued):
        policy.add(req(f"d{i}", "deferred"), clock.now_ms())
    policy.on_heartbeat(hb("w1", free=free, max_slots=max_slots), clock.now_ms())
    clock.advance(500)  # past the deferred window
    decision = policy.schedule(clock.now_ms())
    assert sum(len(b) for b in dispatched_ids(decision)) == expected_size


def test_deferred_waits_while_near_interactive_work_waits_for_its_window():
    policy, clock = make_policy()
    policy.on_heartbeat(hb("w1", free=8), clock.now_ms())
    policy.add(req("d1", "deferred"), clock.now_ms())
    clock.advance(600)
    policy.add(req("n1", "near", now_ms=clock.now_ms()), clock.now_ms())
    assert policy.schedule(clock.now_ms()).batches == []
    assert not policy.deferred_paused()  # more deferred work is read meanwhile, to ride along
    clock.advance(50)
    assert dispatched_ids(policy.schedule(clock.now_ms())) == [["n1", "d1"]]


@pytest.mark.parametrize(
    "heartbeats, deferred, others, paused",
    [
        ([dict(free=8)], 11, 0, False),  # buffer: 2 rounds x (8 slots - 2 reserved) = 12
        ([dict(free=8)], 12, 0, True),
        ([dict(free=0)], 0, 50, False),  # other classes wait and no slot is free: deferred work is still read
        ([dict(free=0, fixed_ms=500, max_slots=64)], 95, 50, False),  # a busy fixed-time engine: 2 x (64 - 16) = 96
        ([dict(free=0, fixed_ms=500, max_slots=64)], 96, 50, True),
        ([dict(free=8), dict(free=8)], 23, 0, False),  # two workers: twice the buffer
        ([], 0, 0, True),  # no worker at all: nothing to read ahead for
    ],
)
def test_deferred_intake_pauses_only_on_its_own_buffer(heartbeats, deferred, others, paused):
    policy, _ = make_policy()
    for i, kwargs in enumerate(heartbeats):
        policy.on_heartbeat(hb(f"w{i}", **kwargs), T0)
    for i in range(deferred):
        policy.add(req(f"d{i}", "deferred"), T0)
    for i in range(others):
        policy.add(req(f"p{i}", "paid"), T0)
    assert policy.deferred_paused() is paused


def test_deferred_work_of_a_model_without_workers_neither_fills_nor_widens_the_buffer():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=8), T0)
    for i in range(20):
        policy.add(req(f"tiny-{i}", "deferred", model="llmq-tiny"), T0)  # no llmq-tiny worker: it waits for one
    assert not policy.deferred_paused()
    for i in range(12):
        policy.add(req(f"sim-{i}", "deferred"), T0)
    assert policy.deferred_paused()


def test_deferred_rides_in_the_empty_slots_of_a_fixed_time_batch_without_delaying_it():
    """A fixed-time engine's batch costs the same whatever its size: deferred work fills it above the reserve."""
    batches = []
    for deferred in (0, 100):
        policy, clock = make_policy()
        policy.on_heartbeat(hb("w1", free=64, max_slots=64, fixed_ms=500), clock.now_ms())
        for i in range(deferred):
            policy.add(req(f"d{i}", "deferred"), clock.now_ms())
        for i in range(10):
            policy.add(req(f"p{i}", "paid" if i % 2 else "near"), clock.now_ms())
        assert policy.schedule(clock.now_ms()).batches == []  # the interactive window of a fixed-time engine
        clock.advance(20)
        batches.append(dispatched_ids(policy.schedule(clock.now_ms())))
    alone, topped_up = batches
    assert len(alone) == len(topped_up) == 1
    assert topped_up[0][:10] == alone[0]  # same interactive work, same moment
    assert topped_up[0][10:] == [f"d{i}" for i in range(38)]  # 64 slots - 16 reserved - 10 interactive


# --- flush triggers --------------------------------------------------------------------------------------------------


def test_near_interactive_waits_its_window_then_flushes_on_wait():
    policy, clock = make_policy()
    policy.on_heartbeat(hb("w1", free=8), clock.now_ms())
    policy.add(req("n1", "near"), clock.now_ms())
    decision = policy.schedule(T0)
    assert decision.batches == []
    assert decision.next_wake_ms == T0 + 50 * 8 // 9  # adaptive: bound * room / (room + pending)
    clock.set(decision.next_wake_ms)
    decision = policy.schedule(clock.now_ms())
    assert dispatched_ids(decision) == [["n1"]] and decision.batches[0].flush_reason == "wait"


@pytest.mark.parametrize("pending, expected_wait_ms", [(1, 44), (4, 33), (7, 26)])
def test_wait_window_shrinks_as_the_queue_deepens(pending, expected_wait_ms):
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=8), T0)
    for i in range(pending):
        policy.add(req(f"n{i}", "near"), T0)
    assert policy.schedule(T0).next_wake_ms == T0 + expected_wait_ms


def test_size_flush_when_the_batch_fills_the_workers_free_slots():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=4), T0)
    for i in range(6):
        policy.add(req(f"n{i}", "near"), T0)
    decision = policy.schedule(T0)
    assert dispatched_ids(decision) == [["n0", "n1", "n2", "n3"]]
    assert decision.batches[0].flush_reason == "size"


def test_batch_never_exceeds_the_models_max_batch_size():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=100, max_slots=100, model="llmq-tiny"), T0)  # llmq-tiny: max batch 32
    for i in range(90):
        policy.add(req(f"r{i}", model="llmq-tiny"), T0)
    sizes = [len(b) for b in dispatched_ids(policy.schedule(T0))]
    assert sizes == [32, 32, 26]


@pytest.mark.parametrize("leads_ms", [(), (40, 30, 20, 10)])
def test_fixed_engine_holds_a_short_window_while_free_then_waits_for_the_batch_to_end(leads_ms):
    """Without leads the next batch goes when the running one ends; with them, its class's lead before (to meet in the
    worker's queue the batches other batchers send for that window)."""
    policy, clock = make_policy(fixed_engine_max_wait_ms=20, fixed_engine_leads_ms=leads_ms)
    policy.on_heartbeat(hb("w1", free=64, max_slots=64, fixed_ms=250), clock.now_ms())
    for i in range(10):
        policy.add(req(f"a{i}"), clock.now_ms())
    decision = policy.schedule(T0)
    assert decision.batches == [] and decision.next_wake_ms == T0 + 20 * 64 // 74
    clock.set(decision.next_wake_ms)
    decision = policy.schedule(clock.now_ms())
    assert [len(b) for b in dispatched_ids(decision)] == [10]
    formed_ms = clock.now_ms()
    for i in range(70):  # arrive while the worker runs its batch: held here, not queued at the worker
        policy.add(req(f"b{i}", now_ms=clock.now_ms()), clock.now_ms())
    decision = policy.schedule(clock.now_ms())
    due_ms = formed_ms + 250 - (leads_ms[0] if leads_ms else 0)
    assert decision.batches == [] and decision.next_wake_ms == due_ms
    clock.set(due_ms)
    decision = policy.schedule(clock.now_ms())
    assert [len(b) for b in dispatched_ids(decision)] == [64] and decision.batches[0].flush_reason == "size"


def test_fixed_engine_full_batch_goes_without_waiting():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=64, max_slots=64, fixed_ms=250), T0)
    for i in range(64):
        policy.add(req(f"r{i}"), T0)
    assert [len(b) for b in dispatched_ids(policy.schedule(T0))] == [64]


def _two_fixed_workers(batch_ms: int, **config):
    """A policy with no fixed-engine window and two idle fixed-time workers of ``batch_ms`` per batch."""
    policy, clock = make_policy(fixed_engine_max_wait_ms=0, **config)
    for worker in ("w1", "w2"):
        policy.on_heartbeat(hb(worker, free=64, max_slots=64, fixed_ms=batch_ms), clock.now_ms())
    return policy, clock


def test_fixed_engine_batch_fills_while_another_batch_of_its_model_runs_until_that_one_ends():
    policy, clock = _two_fixed_workers(5, fixed_engine_busy_wait_ms=10)
    policy.add(req("a"), clock.now_ms())
    assert dispatched_ids(policy.schedule(clock.now_ms())) == [["a"]]  # nothing running: at once
    clock.advance(1)
    policy.add(req("b", now_ms=clock.now_ms()), clock.now_ms())
    decision = policy.schedule(clock.now_ms())
    assert decision.batches == [] and decision.next_wake_ms == T0 + 5  # w2 is idle, yet b waits for a's batch
    clock.advance(3)
    policy.add(req("c", now_ms=clock.now_ms()), clock.now_ms())
    assert policy.schedule(clock.now_ms()).batches == []
    clock.set(T0 + 5)
    assert dispatched_ids(policy.schedule(clock.now_ms())) == [["b", "c"]]


def test_fixed_engine_request_that_finds_no_batch_running_goes_at_once():
    """Light load: the next request comes after the last batch ended, so the busy wait costs it nothing."""
    policy, clock = _two_fixed_workers(5, fixed_engine_busy_wait_ms=10)
    policy.add(req("a"), clock.now_ms())
    assert dispatched_ids(policy.schedule(clock.now_ms())) == [["a"]]
    clock.advance(5)
    policy.add(req("b", now_ms=clock.now_ms()), clock.now_ms())
    assert dispatched_ids(policy.schedule(clock.now_ms())) == [["b"]]


def test_fixed_engine_busy_wait_is_bounded_and_off_at_zero():
    policy, clock = _two_fixed_workers(250, fixed_engine_busy_wait_ms=10)
    policy.add(req("a"), clock.now_ms())
    policy.schedule(clock.now_ms())
    clock.advance(1)
    policy.add(req("b", now_ms=clock.now_ms()), clock.now_ms())
    decision = policy.schedule(clock.now_ms())
    assert decision.batches == [] and decision.next_wake_ms == T0 + 1 + 10 * 64 // 65  # not a's end at T0 + 250
    clock.set(decision.next_wake_ms)
    assert [b.worker_id for b in policy.schedule(clock.now_ms()).batches] == ["w2"]

    policy, clock = _two_fixed_workers(250, fixed_engine_busy_wait_ms=0)
    policy.add(req("a"), clock.now_ms())
    policy.add(req("b"), clock.now_ms())
    policy.schedule(clock.now_ms())  # a and b in one batch to w1
    policy.add(req("c"), clock.now_ms())
    assert [b.worker_id for b in policy.schedule(clock.now_ms()).batches] == ["w2"]


def test_fixed_engine_full_batch_goes_while_another_runs():
    policy, clock = _two_fixed_workers(250, fixed_engine_busy_wait_ms=10)
    policy.add(req("a"), clock.now_ms())
    policy.schedule(clock.now_ms())
    for i in range(64):
        policy.add(req(f"r{i}"), clock.now_ms())
    (batch,) = policy.schedule(clock.now_ms()).batches
    assert (batch.worker_id, len(batch.requests), batch.flush_reason) == ("w2", 64, "size")


def test_drain_flushes_regardless_of_windows():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=8), T0)
    policy.add(req("n1", "near"), T0)
    decision = policy.schedule(T0, drain=True)
    assert dispatched_ids(decision) == [["n1"]] and decision.batches[0].flush_reason == "drain"


# --- fairness --------------------------------------------------------------------------------------------------------


def test_one_tenants_flood_does_not_starve_another_tenants_single_request():
    policy, _ = make_policy()
    for i in range(10_000):
        policy.add(req(f"big{i}", tenant="big"), T0)
    policy.add(req("small", tenant="small"), T0)
    policy.on_heartbeat(hb("w1", free=4), T0)
    assert "small" in dispatched_ids(policy.schedule(T0))[0]


@pytest.mark.parametrize("weights, expected_share_of_a", [({"a": 3.0, "b": 1.0}, 0.75), ({}, 0.5)])
def test_weighted_token_shares(weights, expected_share_of_a):
    policy, clock = make_policy(tenant_weights=weights)
    for i in range(400):
        policy.add(req(f"a{i}", tenant="a", prompt_tokens=30, max_tokens=10), clock.now_ms())  # 40 tokens
        policy.add(req(f"b{i}", tenant="b", prompt_tokens=10, max_tokens=10), clock.now_ms())  # 20 tokens
    tokens = {"a": 0, "b": 0}
    for step in range(50):
        policy.on_heartbeat(hb("w1", free=4, last_batch_id=f"t-{step}", now_ms=clock.now_ms()), clock.now_ms())
        for batch in policy.schedule(clock.now_ms()).batches:
            for r in batch.requests:
                tokens[r.tenant_id] += estimated_tokens(r)
    assert tokens["a"] / (tokens["a"] + tokens["b"]) == pytest.approx(expected_share_of_a, rel=0.05)


def test_per_tenant_in_flight_cap_and_release_on_result():
    policy, _ = make_policy(tenant_max_inflight=2)
    for i in range(5):
        policy.add(req(f"a{i}", tenant="a"), T0)
    policy.add(req("b0", tenant="b"), T0)
    policy.on_heartbeat(hb("w1", free=8), T0)
    assert dispatched_ids(policy.schedule(T0)) == [["a0", "b0", "a1"]]
    policy.on_result("a0")
    assert dispatched_ids(policy.schedule(T0)) == [["a2"]]


def test_idle_heartbeat_covering_every_batch_releases_in_flight_counts():
    policy, _ = make_policy(tenant_max_inflight=1)
    policy.add(req("a0", tenant="a"), T0)
    policy.add(req("a1", tenant="a"), T0)
    policy.on_heartbeat(hb("w1", free=8), T0)
    first = policy.schedule(T0)
    assert dispatched_ids(first) == [["a0"]]
    policy.on_heartbeat(hb("w1", free=8, running=0, last_batch_id=first.batches[0].batch_id), T0)
    assert dispatched_ids(policy.schedule(T0)) == [["a1"]]


# --- deadlines, cancels, bounds ----------------------------------------------------------------------------------------


def test_expired_request_is_answered_and_never_dispatched():
    policy, clock = make_policy()
    policy.add(req("r1", deadline_in_ms=100), clock.now_ms())
    clock.advance(100)
    policy.on_heartbeat(hb("w1", free=8, now_ms=clock.now_ms()), clock.now_ms())
    decision = policy.schedule(clock.now_ms())
    assert decision.batches == []
    assert [(a.request.request_id, a.outcome) for a in decision.answers] == [("r1", wire.Outcome.EXPIRED)]


def test_request_already_past_its_deadline_on_arrival_is_answered():
    policy, _ = make_policy()
    assert policy.add(req("r1", deadline_in_ms=0), T0) is AddStatus.ANSWERED
    assert [a.outcome for a in policy.schedule(T0).answers] == [wire.Outcome.EXPIRED]


def test_next_wake_is_the_earliest_deadline_when_nothing_can_run():
    policy, _ = make_policy()
    policy.add(req("r1", deadline_in_ms=700), T0)
    policy.add(req("r2", deadline_in_ms=300), T0)
    assert policy.schedule(T0).next_wake_ms == T0 + 300


@pytest.mark.parametrize(
    "steps, expected_outcomes, expected_batches",
    [
        (["add", "cancel", "schedule"], [wire.Outcome.CANCELED], []),
        (["cancel", "add", "schedule"], [wire.Outcome.CANCELED], []),  # cancel raced ahead of the request
        (["add", "schedule", "cancel", "schedule"], [], [["r1"]]),  # dispatched: the worker handles the cancel
    ],
)
def test_cancels(steps, expected_outcomes, expected_batches):
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=8), T0)
    outcomes, batches = [], []
    for step in steps:
        if step == "add":
            policy.add(req("r1"), T0)
        elif step == "cancel":
            policy.cancel("r1", "client_disconnected")
        else:
            decision = policy.schedule(T0)
            outcomes += [a.outcome for a in decision.answers]
            batches += dispatched_ids(decision)
    assert outcomes == expected_outcomes and batches == expected_batches


def test_queue_bound_rejects_new_requests_as_overloaded():
    policy, _ = make_policy(max_queued=3)
    statuses = [policy.add(req(f"r{i}"), T0) for i in range(4)]
    assert statuses == [AddStatus.QUEUED] * 3 + [AddStatus.ANSWERED]
    (answer,) = policy.schedule(T0).answers
    assert (answer.request.request_id, answer.outcome, answer.error_type, answer.retryable) == (
        "r3",
        wire.Outcome.ERRORED,
        "overloaded",
        True,
    )


def test_duplicate_of_a_held_request_is_ignored():
    policy, _ = make_policy()
    assert policy.add(req("r1"), T0) is AddStatus.QUEUED
    assert policy.add(req("r1"), T0) is AddStatus.DUPLICATE
    policy.on_heartbeat(hb("w1", free=8), T0)
    assert dispatched_ids(policy.schedule(T0)) == [["r1"]]
    assert policy.add(req("r1"), T0) is AddStatus.DUPLICATE  # in flight


# --- routing -----------------------------------------------------------------------------------------------------------


def test_routes_to_least_outstanding_work_never_round_robin():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=2), T0)
    policy.on_heartbeat(hb("w2", free=5), T0)
    chosen = []
    for i in range(5):
        policy.add(req(f"r{i}"), T0)
        chosen += [b.worker_id for b in policy.schedule(T0).batches]
    assert chosen == ["w2", "w2", "w2", "w1", "w2"]  # most free slots; ties go to the lower drain time, then id


def test_ties_on_free_slots_go_to_the_lower_drain_time():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=4, est_drain_ms=900), T0)
    policy.on_heartbeat(hb("w2", free=4, est_drain_ms=100), T0)
    policy.add(req("r1"), T0)
    assert [b.worker_id for b in policy.schedule(T0).batches] == ["w2"]


def test_models_never_mix_and_route_only_to_their_workers():
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=8, model="llmq-sim"), T0)
    policy.on_heartbeat(hb("w2", free=8, model="llmq-tiny"), T0)
    for i in range(3):
        policy.add(req(f"s{i}", model="llmq-sim"), T0)
        policy.add(req(f"t{i}", model="llmq-tiny"), T0)
    batches = {b.worker_id: (b.model, {r.model for r in b.requests}) for b in policy.schedule(T0).batches}
    assert batches == {"w1": ("llmq-sim", {"llmq-sim"}), "w2": ("llmq-tiny", {"llmq-tiny"})}


@pytest.mark.parametrize(
    "second_heartbeat, expected",
    [
        (dict(free=4), []),  # the worker has not taken batch t-1 yet: its 4 free slots are ours already
        (dict(free=4, last_batch_id="t-1"), [["r4", "r5", "r6", "r7"]]),
    ],
)
def test_free_slots_discount_batches_sent_after_the_heartbeats_last_batch(second_heartbeat, expected):
    policy, _ = make_policy()
    policy.on_heartbeat(hb("w1", free=4), T0)
    for i in range(8):
        policy.add(req(f"r{i}"), T0)
    assert dispatched_ids(policy.schedule(T0)) == [["r0", "r1", "r2", "r3"]]
    policy.on_heartbeat(hb("w1", **second_heartbeat), T0)
    assert dispatched_ids(policy.schedule(T0)) == expected


def test_silent_worker_is_removed_and_its_unfinished_work_requeued_elsewhere():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1", free=8), clock.now_ms())
    for i in range(3):
        policy.add(req(f"r{i}"), clock.now_ms())
    assert dispatched_ids(policy.schedule(T0)) == [["r0", "r1", "r2"]]
    policy.on_result("r1")
    clock.advance(1000)
    policy.on_heartbeat(hb("w2", free=0, now_ms=clock.now_ms()), clock.now_ms())
    clock.advance(1001)  # w1 silent for 2001 ms
    policy.on_heartbeat(hb("w2", free=8, now_ms=clock.now_ms()), clock.now_ms())
    decision = policy.schedule(clock.now_ms())
    assert [(b.worker_id, [(r.request_id, r.attempt) for r in b.requests]) for b in decision.batches] == [
        ("w2", [("r0", 1), ("r2", 1)])
    ]


def test_result_for_a_requeued_request_drops_the_queued_copy():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1", free=8), clock.now_ms())
    policy.add(req("r1"), clock.now_ms())
    policy.schedule(T0)
    clock.advance(2001)
    assert policy.schedule(clock.now_ms()).batches == []  # no worker left: r1 waits, re-queued
    policy.on_result("r1")  # the old worker did finish it after all
    decision = policy.schedule(clock.now_ms())
    assert decision.dropped == ["r1"] and policy.queued_total == 0


def _dispatched(requests: int, free: int, **config):
    """(policy, clock, batch): a policy that has just sent ``batch``, the first of ``requests`` paid requests r0, r1,
    ... to worker w1 with ``free`` slots, at T0; ``config`` overrides PolicyConfig fields."""
    policy, clock = make_policy(**config)
    policy.on_heartbeat(hb("w1", free=free), T0)
    for i in range(requests):
        policy.add(req(f"r{i}"), T0)
    (batch,) = policy.schedule(T0).batches
    return policy, clock, batch


def test_undispatch_puts_the_batch_back_in_front():
    policy, _, batch = _dispatched(3, free=2)
    policy.undispatch(batch, T0)
    assert dispatched_ids(policy.schedule(T0)) == [["r0", "r1"]]


def test_load_reports_depth_and_oldest_age_per_class():
    policy, clock = make_policy()
    policy.add(req("p1"), clock.now_ms())
    clock.advance(30)
    policy.add(req("d1", "deferred", now_ms=clock.now_ms()), clock.now_ms())
    policy.add(req("d2", "deferred", now_ms=clock.now_ms()), clock.now_ms())
    clock.advance(10)
    load = policy.schedule(clock.now_ms()).load
    assert (load["interactive:paid"].depth, load["interactive:paid"].oldest_age_ms) == (1, 40)
    assert (load["deferred"].depth, load["deferred"].oldest_age_ms) == (2, 10)
    assert load["near_interactive"].depth == 0


def test_estimated_tokens_counts_prompt_and_every_choice():
    request = req("r1", prompt_tokens=0, max_tokens=7)
    assert estimated_tokens(request) == len("x") + 7


# --- byte budget: one Batch is one Kafka record ----------------------------------------------------------------------

UNIT = entry_bytes(req("r0", prompt="x" * 1000))  # a 1,000-character prompt; budgets below are in these units


def _sized(request_id: str, chars: int, **kwargs) -> wire.GenerationRequest:
    return req(request_id, prompt="x" * chars, **kwargs)


@pytest.mark.parametrize(
    "prompts, expected_batches, too_large",
    [
        ([1000, 1000, 1000], [["r0", "r1"], ["r2"]], []),  # two fit in a record, the third heads the next one
        ([2000, 1000], [["r0"], ["r1"]], []),
        ([1000, 2000, 1000], [["r0"], ["r1"], ["r2"]], []),  # r2 fits beside r0 yet never passes r1
        ([10, 10, 10, 10], [["r0", "r1", "r2", "r3"]], []),  # small requests: the count, not the bytes, bounds
        ([3000, 1000], [["r1"]], ["r0"]),  # r0 alone overflows any record: answered at once, never queued
    ],
)
def test_batches_are_capped_by_encoded_bytes_in_fair_order(prompts, expected_batches, too_large):
    policy, _ = make_policy(max_batch_bytes=2 * UNIT)
    policy.on_heartbeat(hb("w1", free=8), T0)
    for i, chars in enumerate(prompts):
        policy.add(_sized(f"r{i}", chars), T0)
    decision = policy.schedule(T0)
    assert dispatched_ids(decision) == expected_batches
    assert all(sum(entry_bytes(r) for r in b.requests) <= 2 * UNIT for b in decision.batches)
    assert [a.request.request_id for a in decision.answers] == too_large
    for answer in decision.answers:
        assert (answer.outcome, answer.error_type, answer.code, answer.retryable) == (
            wire.Outcome.ERRORED,
            "invalid_request_error",
            ErrorCode.REQUEST_TOO_LARGE,
            False,
        )


def test_a_batch_full_by_bytes_flushes_before_the_window():
    near = [_sized(f"n{i}", 1000, cls="near") for i in range(3)]
    policy, _ = make_policy(max_batch_bytes=2 * entry_bytes(near[0]))
    policy.on_heartbeat(hb("w1", free=8), T0)
    policy.add(near[0], T0)
    assert policy.schedule(T0).batches == []  # one request, room for eight: it waits its window
    policy.add(near[1], T0)
    policy.add(near[2], T0)
    decision = policy.schedule(T0)
    assert dispatched_ids(decision)[0] == ["n0", "n1"] and decision.batches[0].flush_reason == "size"


def test_split_sends_the_halves_to_the_same_worker_under_new_ids():
    policy, _, batch = _dispatched(5, free=8)
    parts = policy.split(batch, T0)
    assert [[r.request_id for r in p.requests] for p in parts] == [["r0", "r1", "r2"], ["r3", "r4"]]
    assert {(p.worker_id, p.partition) for p in parts} == {("w1", 1)}
    assert len({batch.batch_id, *(p.batch_id for p in parts)}) == 3
    policy.add(req("r5"), T0)  # the worker's count still holds the 5 split requests: 3 slots left
    assert policy.inflight_total == 5 and dispatched_ids(policy.schedule(T0)) == [["r5"]]


def test_split_of_a_batch_whose_worker_went_silent_is_empty():
    policy, clock, batch = _dispatched(2, free=8, worker_heartbeat_timeout_ms=2000)
    clock.advance(2001)
    policy.schedule(clock.now_ms())  # w1 is gone: its requests are queued again
    assert policy.split(batch, clock.now_ms()) == [] and policy.queued_total == 2


def test_fail_answers_the_batch_errored_and_frees_its_slots():
    policy, _, batch = _dispatched(4, free=2, tenant_max_inflight=2)
    policy.fail(batch, "invalid_request_error", "too large", ErrorCode.REQUEST_TOO_LARGE)
    decision = policy.schedule(T0)
    assert [(a.request.request_id, a.outcome, a.code) for a in decision.answers] == [
        ("r0", wire.Outcome.ERRORED, ErrorCode.REQUEST_TOO_LARGE),
        ("r1", wire.Outcome.ERRORED, ErrorCode.REQUEST_TOO_LARGE),
    ]
    assert dispatched_ids(decision) == [["r2", "r3"]]  # the tenant's cap and the worker's slots were freed


def test_undispatch_with_a_retry_delay_holds_the_model_until_then():
    policy, clock = make_policy()
    policy.on_heartbeat(hb("w1", free=8), clock.now_ms())
    policy.on_heartbeat(hb("w2", free=8, model="llmq-tiny"), clock.now_ms())
    policy.add(req("r0"), clock.now_ms())
    (batch,) = policy.schedule(T0).batches
    policy.undispatch(batch, clock.now_ms(), retry_in_ms=200)
    policy.add(req("t0", model="llmq-tiny"), clock.now_ms())
    decision = policy.schedule(T0)
    assert dispatched_ids(decision) == [["t0"]] and decision.next_wake_ms == T0 + 200  # only llmq-sim waits
    clock.advance(200)
    assert [(b.requests[0].request_id, b.requests[0].attempt) for b in policy.schedule(clock.now_ms()).batches] == [
        ("r0", 1)
    ]


# --- configuration -----------------------------------------------------------------------------------------------------


READS = [  # (PolicyConfig field, the batcher setting it comes from, a value unlike its default)
    ("fixed_engine_max_wait_ms", "fixed_engine_max_wait_ms", 4),
    ("fixed_engine_busy_wait_ms", "fixed_engine_busy_wait_ms", 9),
    ("worker_heartbeat_timeout_ms", "worker_heartbeat_timeout_ms", 5),
    ("max_queued", "max_queued", 6),
    ("deferred_reserved_share", "deferred_reserved_share", 0.5),
    ("deferred_buffer_rounds", "deferred_buffer_rounds", 7),
    ("tenant_max_inflight", "tenant_max_inflight", 8),
    ("tenant_weights", "tenant_weights", {"acme": 2.0}),
]


def test_config_from_settings_reads_every_batcher_setting():
    waits_ms = {"interactive": 1, "near_interactive": 2, "deferred": 3}
    batcher = {setting: value for _, setting, value in READS} | {f"{c}_max_wait_ms": ms for c, ms in waits_ms.items()}
    settings = Settings(batcher=batcher)
    config = PolicyConfig.from_settings(settings, "b-1")
    assert [getattr(config, name) for name, _, _ in READS] == [value for _, _, value in READS]
    assert (config.max_wait_ms, config.batch_id_prefix) == (waits_ms, "b-1")


def test_each_priority_class_has_its_own_queue_and_both_interactive_tiers_share_one_wait_bound():
    assert [class_index(req("r", cls)) for cls in ("paid", "free", "near", "deferred")] == [0, 1, 2, 3]
    bounds_ms = {"interactive": 30, "near_interactive": 60, "deferred": 90}
    policy, _ = make_policy(max_wait_ms=bounds_ms, deferred_reserved_share=0)  # one room for all: 8 slots
    policy.on_heartbeat(hb("w1", free=8), T0)
    for cls in ("paid", "free", "near", "deferred"):
        request = req(cls, cls)
        policy.add(request, T0)
        assert policy.schedule(T0).next_wake_ms == T0 + bounds_ms[request.traffic_class] * 8 // 9  # adaptive
        policy.on_result(cls)


def test_default_config_is_the_settings_defaults_whatever_the_environment(monkeypatch):
    monkeypatch.setenv("LLMQ_BATCHER_MAX_QUEUED", "5")
    assert PolicyConfig.from_settings(Settings(), "t").max_queued == 5
    assert PolicyConfig.defaults("t") == PolicyConfig.from_settings(Settings(batcher={"max_queued": 100_000}), "t")


def test_a_result_of_another_tenant_neither_drops_a_queued_request_nor_frees_a_dispatched_one():
    policy, _ = make_policy(tenant_max_inflight=1)
    policy.add(req("a0", tenant="a"), T0)
    policy.add(req("a1", tenant="a"), T0)
    policy.on_result("a1", "mallory")  # forged: a worker principal may write llmq.results
    policy.on_heartbeat(hb("w1", free=8), T0)
    assert dispatched_ids(policy.schedule(T0)) == [["a0"]] and policy.holds("a1")
    policy.on_result("a0", "mallory")
    assert policy.schedule(T0).batches == [] and policy.holds("a0")  # a0 still holds tenant a's one in-flight slot
    policy.on_result("a0", "a")
    assert dispatched_ids(policy.schedule(T0)) == [["a1"]]

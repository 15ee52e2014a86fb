"""Properties of the batching policy over random event sequences (hypothesis)."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmq_batcher.policy import class_index, estimated_tokens
from llmq_core import wire
from llmq_core.status import ErrorCode
from tests.unit.batcher.helpers import CLASSES, counts, entry_bytes, hb, make_policy, recount, req

WORKERS = {  # worker id -> (model, fixed batch time ms)
    "w0": ("llmq-sim", 0),
    "w1": ("llmq-sim", 0),
    "w2": ("llmq-tiny", 0),
    "w3": ("llmq-sim", 250),
}
MODELS = ("llmq-sim", "llmq-tiny", "no-worker-model")
TENANTS = ("t0", "t1", "t2")

BATCH_BYTES = 6000  # a small record: prompts below overflow it in twos and threes, now and then alone
_add = st.tuples(
    st.just("add"),
    st.sampled_from(sorted(CLASSES)),
    st.sampled_from(TENANTS),
    st.sampled_from(MODELS),
    st.integers(1, 3000),
    st.one_of(st.integers(0, 100), st.integers(0, 7000)),
)
ops = st.one_of(  # adds weigh triple and free slots lean small, so queues build up and capacity is often short
    _add,
    _add,
    _add,
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    st.tuples(
        st.just("hb"), st.sampled_from(sorted(WORKERS)), st.one_of(st.integers(0, 2), st.integers(0, 8)), st.booleans()
    ),
    st.tuples(st.just("result"), st.integers(0, 10_000)),
    st.tuples(st.just("advance"), st.integers(1, 400)),
    st.tuples(st.just("schedule"), st.booleans()),
)


class Harness:
    """Drives a policy and records every request's fate; asserts per-decision invariants as it goes."""

    def __init__(self, heartbeat_timeout_ms: int) -> None:
        self.policy, self.clock = make_policy(
            worker_heartbeat_timeout_ms=heartbeat_timeout_ms, tenant_max_inflight=10**6, max_batch_bytes=BATCH_BYTES
        )
        self.requests: dict[str, wire.GenerationRequest] = {}
        self.dispatches: list[tuple[str, int]] = []  # (request id, attempt)
        self.answered: dict[str, wire.Outcome] = {}
        self.in_flight: list[str] = []
        self.last_batch: dict[str, str] = {}

    def run(self, op: tuple) -> None:
        getattr(self, f"_{op[0]}")(*op[1:])
        self.check_counts()

    def check_counts(self) -> None:
        """The entry table's counts equal a recount of its entries, and the queues and workers hold the same."""
        policy = self.policy
        table = policy._entries
        assert counts(table, TENANTS) == recount(table), "the entry table's counts drifted"
        assert table.queued == sum(q.depth for m in policy._fleet.models.values() for q in m.queues)
        assert table.inflight == sum(len(w.held()) for w in policy._fleet.workers.values())

    def finish(self) -> None:
        """Let every deadline pass with a live worker of each model: everything must end answered or dispatched."""
        self.clock.advance(10_000)
        for worker_id in WORKERS:
            self._hb(worker_id, 8, True)
        self._schedule(True)

    def _add(self, cls: str, tenant: str, model: str, deadline_in_ms: int, prompt_chars: int) -> None:
        request_id = f"r{len(self.requests)}"
        request = req(
            request_id,
            cls,
            tenant=tenant,
            model=model,
            now_ms=self.clock.now_ms(),
            deadline_in_ms=deadline_in_ms,
            prompt="x" * prompt_chars,
        )
        self.requests[request_id] = request
        self.policy.add(request, self.clock.now_ms())

    def _cancel(self, index: int) -> None:
        if self.requests:
            self.policy.cancel(f"r{index % len(self.requests)}")

    def _hb(self, worker_id: str, free: int, took_all: bool) -> None:
        model, fixed_ms = WORKERS[worker_id]
        last = self.last_batch.get(worker_id, "") if took_all else ""
        self.policy.on_heartbeat(
            hb(worker_id, free=free, model=model, fixed_ms=fixed_ms, last_batch_id=last, now_ms=self.clock.now_ms()),
            self.clock.now_ms(),
        )

    def _result(self, index: int) -> None:
        if self.in_flight:
            self.policy.on_result(self.in_flight.pop(index % len(self.in_flight)))

    def _advance(self, ms: int) -> None:
        self.clock.advance(ms)

    def _schedule(self, drain: bool) -> None:
        now_ms = self.clock.now_ms()
        decision = self.policy.schedule(now_ms, drain=drain)
        for answer in decision.answers:
            request_id = answer.request.request_id
            assert request_id not in self.answered, f"{request_id} answered twice"
            too_large = entry_bytes(answer.request) > BATCH_BYTES
            assert (answer.code == ErrorCode.REQUEST_TOO_LARGE) is too_large, (
                f"{request_id} fits yet was refused, or vice versa"
            )
            self.answered[request_id] = answer.outcome
        for batch in decision.batches:
            assert WORKERS[batch.worker_id][0] == batch.model
            assert {r.model for r in batch.requests} == {batch.model}, "a batch mixed models"
            assert 0 < len(batch.requests) <= 64
            assert sum(entry_bytes(r) for r in batch.requests) <= BATCH_BYTES, "a batch overflows its record"
            self.last_batch[batch.worker_id] = batch.batch_id
            for request in batch.requests:
                assert request.deadline_ms > now_ms, "dispatched an expired request"
                self.dispatches.append((request.request_id, request.attempt))
                self.in_flight.append(request.request_id)
        self._check_precedence(decision)

    def _check_precedence(self, decision) -> None:
        """After a decision, no queued request outranks a request just dispatched for the same model."""
        queued = [
            r for rid, r in self.requests.items() if rid not in self.answered and rid not in self.dispatched_ids()
        ]
        for batch in decision.batches:
            lowest = max(class_index(r) for r in batch.requests)
            outranking = [r.request_id for r in queued if r.model == batch.model and class_index(r) < lowest]
            assert not outranking, f"{outranking} stayed queued behind class {lowest}"

    def dispatched_ids(self) -> set[str]:
        return {rid for rid, _ in self.dispatches}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=30, max_size=100))
def test_nothing_lost_nothing_twice_nothing_expired_dispatched(sequence):
    harness = Harness(heartbeat_timeout_ms=10**9)  # workers never time out here: every dispatch is final
    for op in sequence:
        harness.run(op)
    harness.finish()
    dispatched = [rid for rid, _ in harness.dispatches]
    assert len(dispatched) == len(set(dispatched)), "a request was dispatched twice"
    assert not set(dispatched) & set(harness.answered), "a request was both dispatched and answered"
    assert set(dispatched) | set(harness.answered) == set(harness.requests), "a request was lost"
    assert harness.policy.queued_total == 0
    assert not any(q.size_bytes for m in harness.policy._fleet.models.values() for q in m.queues), (
        "queued bytes drifted"
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=30, max_size=100))
def test_with_worker_timeouts_each_attempt_is_dispatched_once(sequence):
    harness = Harness(heartbeat_timeout_ms=500)
    for op in sequence:
        harness.run(op)
    harness.finish()
    assert len(harness.dispatches) == len(set(harness.dispatches)), "an attempt was dispatched twice"
    attempts: dict[str, list[int]] = {}
    for request_id, attempt in harness.dispatches:
        attempts.setdefault(request_id, []).append(attempt)
    assert all(a == sorted(a) and a[0] == 0 for a in attempts.values()), "re-dispatch without a new attempt"
    assert set(attempts) | set(harness.answered) == set(harness.requests), "a request was lost"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    costs=st.lists(st.lists(st.integers(20, 200), min_size=1, max_size=5), min_size=4, max_size=4),
    frees=st.lists(st.integers(1, 8), min_size=1, max_size=20),
)
def test_backlogged_tenants_share_tokens_by_weight(weights, costs, frees):
    backlog = 1500
    tenants = [f"t{i}" for i in range(len(weights))]
    policy, clock = make_policy(tenant_weights=dict(zip(tenants, map(float, weights))))
    for i in range(backlog):
        for t, tenant in enumerate(tenants):
            cost = costs[t][i % len(costs[t])]
            policy.add(req(f"{tenant}-{i}", tenant=tenant, prompt_tokens=cost, max_tokens=0), clock.now_ms())
    tokens, served = dict.fromkeys(tenants, 0), dict.fromkeys(tenants, 0)
    step = 0
    while max(served.values()) < backlog - 100:  # measure only while every tenant is still backlogged
        policy.on_heartbeat(
            hb("w1", free=frees[step % len(frees)], last_batch_id=f"t-{step}", now_ms=clock.now_ms()), clock.now_ms()
        )
        for batch in policy.schedule(clock.now_ms()).batches:
            for request in batch.requests:
                tokens[request.tenant_id] += estimated_tokens(request)
                served[request.tenant_id] += 1
        step += 1
    total_tokens, total_weight = sum(tokens.values()), sum(weights)
    for tenant, weight in zip(tenants, weights):
        expected = weight / total_weight
        assert abs(tokens[tenant] / total_tokens - expected) <= 0.1 * expected, (tokens, weights)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.lists(
        st.tuples(st.sampled_from(TENANTS), st.sampled_from(sorted(CLASSES)), st.integers(0, 7000)),
        min_size=1,
        max_size=40,
    ),
    frees=st.lists(st.integers(3, 8), min_size=1, max_size=8),
)
def test_byte_budget_starves_no_request(arrivals, frees):
    """Every round with work queued and a worker with room dispatches something, so each request that fits goes out
    within as many rounds as there are requests, in its tenant's and class's arrival order; the rest are refused."""
    policy, clock = make_policy(max_batch_bytes=BATCH_BYTES)
    requests = [
        req(f"r{i:02}", cls, tenant=tenant, deadline_in_ms=10**9, prompt="x" * chars)
        for i, (tenant, cls, chars) in enumerate(arrivals)
    ]
    for request in requests:
        policy.add(request, clock.now_ms())
    dispatched, refused, last_batch = [], [], ""
    for step in range(len(requests)):
        clock.advance(500)  # past every window: only room and bytes decide
        policy.on_heartbeat(
            hb("w1", free=frees[step % len(frees)], last_batch_id=last_batch, now_ms=clock.now_ms()), clock.now_ms()
        )
        queued = policy.queued_total
        decision = policy.schedule(clock.now_ms())
        refused += [a.request.request_id for a in decision.answers]
        assert decision.batches or not queued, "a round with room dispatched nothing"
        for batch in decision.batches:
            assert sum(entry_bytes(r) for r in batch.requests) <= BATCH_BYTES
            dispatched += [r.request_id for r in batch.requests]
            last_batch = batch.batch_id
    fits = [r.request_id for r in requests if entry_bytes(r) <= BATCH_BYTES]
    assert sorted(dispatched) == fits
    assert sorted(refused) == [r.request_id for r in requests if r.request_id not in fits]
    lanes: dict[tuple[str, str], list[str]] = {}
    for (tenant, cls, _), request in zip(arrivals, requests):
        if request.request_id in fits:
            lanes.setdefault((tenant, cls), []).append(request.request_id)
    for lane in lanes.values():
        assert [rid for rid in dispatched if rid in lane] == lane, "a request was passed by a later one of its lane"


SLOTS = 8  # every worker of the one-step properties below; its reserve is 2 (25%)
_frees = st.lists(st.integers(0, SLOTS), min_size=1, max_size=3)  # free slots per worker; all continuous or all fixed
_workers = st.one_of(_frees.map(lambda f: [(0, n) for n in f]), _frees.map(lambda f: [(250, n) for n in f]))
_queue = st.lists(st.tuples(st.sampled_from(("paid", "free", "near")), st.sampled_from(TENANTS)), max_size=20)


def _one_step(workers, others, deferred: int):
    """(fixed batch time ms, free slots) per worker. One schedule past every window, after ``others`` and ``deferred`` requests of llmq-sim arrived."""
    policy, clock = make_policy(tenant_max_inflight=10**6)
    for i, (fixed_ms, free) in enumerate(workers):
        policy.on_heartbeat(hb(f"w{i}", free=free, max_slots=SLOTS, fixed_ms=fixed_ms), clock.now_ms())
    for i, (cls, tenant) in enumerate(others):
        policy.add(req(f"o{i}", cls, tenant=tenant), clock.now_ms())
    for i in range(deferred):
        policy.add(req(f"d{i}", "deferred", tenant=TENANTS[i % len(TENANTS)]), clock.now_ms())
    clock.advance(500)
    free = {w.worker_id: w.free_slots(clock.now_ms()) for w in policy._fleet.workers.values()}
    return policy.schedule(clock.now_ms()), free


@settings(max_examples=150, deadline=None)
@given(workers=_workers, others=_queue, deferred=st.integers(0, 30))
def test_deferred_fills_empty_slots_above_the_reserve_and_never_displaces_other_work(workers, others, deferred):
    with_deferred, free = _one_step(workers, others, deferred)
    without, _ = _one_step(workers, others, 0)
    reserve = SLOTS // 4
    others_of = [[r.request_id for r in b.requests if r.traffic_class != "deferred"] for b in with_deferred.batches]
    assert [ids for ids in others_of if ids] == [[r.request_id for r in b.requests] for b in without.batches], (
        "deferred work changed which other work went out, or where"
    )
    sent: dict[str, int] = {}
    carried: set[str] = set()
    for batch in with_deferred.batches:
        sent[batch.worker_id] = sent.get(batch.worker_id, 0) + len(batch.requests)
        if any(r.traffic_class == "deferred" for r in batch.requests):
            carried.add(batch.worker_id)
    assert all(sent[w] <= free[w] - reserve for w in carried), "deferred work took a reserved slot"
    deferred_sent = sum(len(b.requests) - len(ids) for b, ids in zip(with_deferred.batches, others_of))
    room_left = sum(max(free[w] - reserve - sent.get(w, 0), 0) for w in free)
    assert deferred_sent == deferred or room_left == 0, "deferred work stayed queued beside empty slots"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.tuples(st.integers(1, 16), st.integers(64, 512)), min_size=1, max_size=6),
    frees=st.lists(st.integers(1, 8), min_size=1, max_size=10),
)
def test_a_tenant_of_huge_requests_gets_a_fair_share_of_tokens_not_of_requests(shapes, frees):
    """Fair share weighs estimated tokens (prompt + n x max_tokens), not requests (QA finding 3): while both tenants are
    backlogged, the tokens dispatched to each differ by at most one request's estimate of each (SFQ's bound), so a tenant
    of huge requests lets many small requests of another tenant through between two of its own."""
    policy, clock = make_policy()
    big_left, small_left = 60, 3000
    for i in range(big_left):
        n, max_tokens = shapes[i % len(shapes)]
        big = req(f"big-{i}", tenant="big", max_tokens=max_tokens, deadline_in_ms=10**9)
        policy.add(
            msgspec.structs.replace(big, sampling=wire.SamplingParams(max_tokens=max_tokens, n=n)), clock.now_ms()
        )
    for i in range(small_left):
        policy.add(req(f"small-{i}", tenant="small", max_tokens=50, deadline_in_ms=10**9), clock.now_ms())
    bound = max(n * max_tokens for n, max_tokens in shapes) + 10 + (50 + 10)  # largest big + small estimate
    tokens = {"big": 0, "small": 0}
    step = 0
    while big_left and small_left:
        policy.on_heartbeat(
            hb("w1", free=frees[step % len(frees)], last_batch_id=f"t-{step}", now_ms=clock.now_ms()), clock.now_ms()
        )
        for batch in policy.schedule(clock.now_ms()).batches:
            for request in batch.requests:
                tokens[request.tenant_id] += estimated_tokens(request)
                if request.tenant_id == "big":
                    big_left -= 1
                else:
                    small_left -= 1
        if big_left and small_left:  # a round that empties one lane may then serve only the other
            assert abs(tokens["big"] - tokens["small"]) <= bound, (step, tokens)
        step += 1

"""Prefix-aware dispatch: the scorer's decisions, and batch forming by them (continuous-batching workers only)."""

from __future__ import annotations

from llmq_batcher.prefix_route import Candidate, Route, choose
from llmq_core import wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.metrics import BatcherMetrics
from llmq_core.prefixes import request_chain
from tests.unit.batcher.helpers import MODEL, hb, make_policy, req

PROMPT_A = "a" * (8 * PREFIX_BLOCK_BYTES)
PROMPT_B = "b" * (8 * PREFIX_BLOCK_BYTES)


def test_the_holder_of_the_longest_prefix_keeps_affinity_below_the_threshold():
    candidates = [Candidate("w1", 8, 8, 0), Candidate("w2", 3, 8, 5), Candidate("w3", 4, 8, 2)]
    assert choose(candidates, "w1", 0.75) == Route("w2", "affinity", 5)


def test_a_holder_loaded_past_the_threshold_loses_the_batch_to_the_least_loaded():
    candidates = [Candidate("w1", 8, 8, 1), Candidate("w2", 2, 8, 5)]  # w2's load: 0.75
    assert choose(candidates, "w1", 0.75) == Route("w1", "load_override", 1)
    assert choose(candidates, "w1", 0.8) == Route("w2", "affinity", 5)


def test_a_loaded_holder_that_is_the_least_loaded_anyway_keeps_affinity():
    assert choose([Candidate("w1", 1, 8, 3), Candidate("w2", 1, 8, 0)], "w1", 0.5) == Route("w1", "affinity", 3)


def test_without_any_match_the_least_loaded_takes_the_batch():
    assert choose([Candidate("w1", 2, 8, 0), Candidate("w2", 8, 8, 0)], "w2", 0.75) == Route("w2", "no_match")


def test_equal_holders_go_by_load_then_worker_id():
    assert choose([Candidate("w2", 4, 8, 3), Candidate("w1", 2, 8, 3)], "w2", 0.9).worker_id == "w2"
    assert choose([Candidate("w2", 4, 8, 3), Candidate("w1", 4, 8, 3)], "w2", 0.9).worker_id == "w1"


def summary(worker_id: str, prompt: str, now_ms: int) -> wire.PrefixSummary:
    chain = request_chain(req("warm", prompt=prompt), True)
    return wire.PrefixSummary(
        worker_id=worker_id, model=MODEL, block_bytes=PREFIX_BLOCK_BYTES, blocks=list(chain), sent_ms=now_ms
    )


def two_warm_workers(**config):
    """Policy with live w1 (warm on PROMPT_A) and w2 (warm on PROMPT_B), both idle, 8 slots."""
    policy, clock = make_policy(**config)
    now = clock.now_ms()
    for worker_id, prompt in (("w1", PROMPT_A), ("w2", PROMPT_B)):
        policy.on_heartbeat(hb(worker_id, now_ms=now), now)
        policy.on_prefix_summary(summary(worker_id, prompt, now), now)
    return policy, clock


def routes(decision) -> list[tuple[str, str | None, list[str]]]:
    return [(b.worker_id, b.route, [r.request_id for r in b.requests]) for b in decision.batches]


def test_batches_go_to_the_worker_holding_their_prefix():
    policy, clock = two_warm_workers()
    now = clock.now_ms()
    for i in range(3):
        policy.add(req(f"b{i}", prompt=PROMPT_B + f" question {i}"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w2", "affinity", ["b0", "b1", "b2"])]
    for i in range(2):
        policy.add(req(f"a{i}", prompt=PROMPT_A + f" question {i}"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w1", "affinity", ["a0", "a1"])]


def test_a_saturated_holder_sends_the_batch_to_the_least_loaded_worker():
    policy, clock = two_warm_workers()
    now = clock.now_ms()
    policy.on_heartbeat(hb("w1", free=1, now_ms=now), now)  # load 7/8 past 0.75
    policy.add(req("a0", prompt=PROMPT_A + " q"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w2", "load_override", ["a0"])]
    # w2 holds the prefix too now (this batcher sent it there); of two holders the less loaded keeps it
    policy.on_heartbeat(hb("w1", free=4, now_ms=now), now)  # load 0.5
    policy.on_heartbeat(hb("w2", free=3, now_ms=now), now)  # load 0.625
    policy.add(req("a1", prompt=PROMPT_A + " q"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w1", "affinity", ["a1"])]


def test_lines_sharing_a_prefix_stick_to_one_worker_before_any_summary_names_it():
    """No summaries at all: the first batch goes least-loaded, the next follow it while it stays below the threshold
    (its room shrinks by what this batcher sent it), then the next goes elsewhere."""
    policy, clock = make_policy(model_max_batch={MODEL: 2})
    now = clock.now_ms()
    for worker_id in ("w1", "w2"):
        policy.on_heartbeat(hb(worker_id, now_ms=now), now)
    for i in range(10):
        policy.add(req(f"line-{i}", prompt=PROMPT_A + f" line {i}"), now)
    decided = routes(policy.schedule(now, drain=True))
    assert [(w, r) for w, r, _ in decided] == [
        ("w1", "no_match"),  # load 0 -> 2/8
        ("w1", "affinity"),  # 4/8
        ("w1", "affinity"),  # 6/8: past 0.75 after this one
        ("w2", "load_override"),
        ("w2", "affinity"),  # w2 holds it now too, and is less loaded
    ]


def test_tenants_do_not_draw_each_others_affinity():
    policy, clock = two_warm_workers()
    now = clock.now_ms()
    policy.add(req("other", prompt=PROMPT_A + " q", tenant="globex"), now)  # the summaries are acme's
    assert routes(policy.schedule(now, drain=True)) == [("w1", "no_match", ["other"])]


def test_routing_off_keeps_the_least_loaded_worker():
    policy, clock = two_warm_workers(prefix_routing=False)
    now = clock.now_ms()
    policy.on_heartbeat(hb("w1", free=7, now_ms=now), now)
    policy.add(req("a0", prompt=PROMPT_A + " q"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w2", "off", ["a0"])]


def test_fixed_time_workers_keep_the_least_loaded_choice():
    policy, clock = make_policy()
    now = clock.now_ms()
    for worker_id, prompt in (("w1", PROMPT_A), ("w2", PROMPT_B)):
        policy.on_heartbeat(hb(worker_id, fixed_ms=500, now_ms=now), now)
        policy.on_prefix_summary(summary(worker_id, prompt, now), now)
    policy.add(req("b0", prompt=PROMPT_B + " q"), now)
    assert routes(policy.schedule(now, drain=True)) == [("w1", None, ["b0"])]  # w1 ranks first; no route counted
    assert policy.prefixes.matched("w1", request_chain(req("b", prompt=PROMPT_B), True), now) == 0  # none recorded


def test_the_decisions_are_counted_by_model_and_reason():
    metrics = BatcherMetrics()
    metrics.dispatched(MODEL, "size", [req("r")], 0, 8, "affinity")
    metrics.dispatched(MODEL, "size", [req("r")], 0, 8, "affinity")
    metrics.dispatched(MODEL, "size", [req("r")], 0, 8, None)
    metrics.prefix_index(12, {"block_bytes": 2})
    metrics.prefix_index(12, {"block_bytes": 3})
    value = metrics.registry.get_sample_value
    assert value("llmq_batcher_prefix_route_decisions_total", {"model": MODEL, "reason": "affinity"}) == 2
    assert value("llmq_batcher_prefix_index_blocks") == 12
    assert value("llmq_batcher_prefix_summaries_ignored_total", {"reason": "block_bytes"}) == 3

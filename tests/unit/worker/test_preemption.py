"""The preemption rules (llmq_worker.preemption): which running deferred jobs make room for people's work, and the
order an engine admits what waits."""

from __future__ import annotations

import pytest

from llmq_core.constants import DEFERRED, INTERACTIVE, NEAR_INTERACTIVE
from llmq_worker.preemption import JobView, admission_order, choose_victims, preemptible, preemptible_sequences

NOW_MS = 1_000_000
LIMITS = {"ms_per_token": 10.0, "max_preemptions": 2, "min_slack_ms": 60_000}


def job(request_id: str, traffic_class: str = DEFERRED, **fields) -> JobView:
    values = {
        "sequences": 1,
        "generated": 10,
        "tokens_left": 100,
        "deadline_ms": NOW_MS + 3_600_000,
        "preemptions": 0,
        "resumable": True,
        "order": 0,
    }
    return JobView(request_id=request_id, traffic_class=traffic_class, **(values | fields))


def test_people_are_admitted_before_deferred_work_each_class_oldest_first():
    waiting = [
        job("d-old", order=0),
        job("i-new", INTERACTIVE, order=4),
        job("n", NEAR_INTERACTIVE, order=2),
        job("i-old", INTERACTIVE, order=3),
        job("d-new", order=1),
    ]
    assert [j.request_id for j in admission_order(waiting)] == ["i-old", "i-new", "n", "d-old", "d-new"]


def test_nothing_is_preempted_while_free_slots_hold_the_waiting_people_or_only_deferred_work_waits():
    running = [job("d1"), job("d2")]
    assert choose_victims(running, [job("i", INTERACTIVE, sequences=2)], 2, NOW_MS, **LIMITS) == []
    assert choose_victims(running, [job("d3"), job("d4")], 0, NOW_MS, **LIMITS) == []


def test_the_least_generated_deferred_jobs_go_first_and_only_as_many_as_the_waiting_sequences_need():
    running = [
        job("most", generated=300),
        job("least", generated=5),
        job("middle", generated=50, sequences=2),
        job("person", INTERACTIVE, generated=0),
    ]
    waiting = [job("i", INTERACTIVE, sequences=2), job("n", NEAR_INTERACTIVE), job("d")]
    assert choose_victims(running, waiting, 0, NOW_MS, **LIMITS) == ["least", "middle"]
    assert choose_victims(running, waiting, 2, NOW_MS, **LIMITS) == ["least"]


def test_ties_on_generated_tokens_go_to_the_latest_deadline_then_the_latest_arrival():
    running = [
        job("soon", deadline_ms=NOW_MS + 100_000, order=5),
        job("late-a", deadline_ms=NOW_MS + 900_000, order=1),
        job("late-b", deadline_ms=NOW_MS + 900_000, order=2),
    ]
    assert choose_victims(running, [job("i", INTERACTIVE)], 0, NOW_MS, **LIMITS) == ["late-b"]


def test_a_job_preempted_fewer_times_goes_before_one_with_fewer_generated_tokens():
    """The oldest waiting job resumes first, so by generated tokens alone the job just resumed would be the next
    victim again and again, spending its preemptions while the others keep theirs."""
    running = [job("resumed", generated=40, preemptions=1), job("never", generated=300, order=1)]
    assert choose_victims(running, [job("i", INTERACTIVE)], 0, NOW_MS, **LIMITS) == ["never"]
    assert choose_victims(running, [job("i", INTERACTIVE, sequences=2)], 0, NOW_MS, **LIMITS) == ["never", "resumed"]


@pytest.mark.parametrize(
    "victim, why",
    [
        (job("v", INTERACTIVE), "interactive work is never preempted"),
        (job("v", NEAR_INTERACTIVE), "nor near-interactive"),
        (job("v", resumable=False), "structured outputs or logprobs cannot cross a seam"),
        (job("v", preemptions=2), "preempted its limit of times already"),
        # 100 tokens left at 10 ms each take 1 s: the deadline must leave the 60 s slack beyond it
        (job("v", deadline_ms=NOW_MS + 60_999), "its deadline is too near"),
    ],
)
def test_a_job_the_rules_protect_is_never_chosen(victim, why):
    assert not preemptible(victim, NOW_MS, **LIMITS), why
    assert choose_victims([victim], [job("i", INTERACTIVE)], 0, NOW_MS, **LIMITS) == [], why
    assert preemptible_sequences([victim], NOW_MS, **LIMITS) == 0


def test_the_deadline_rule_counts_the_tokens_left_at_the_current_rate_and_an_unmeasured_rate_as_no_time():
    edge = job("v", deadline_ms=NOW_MS + 61_000, tokens_left=100)
    assert preemptible(edge, NOW_MS, **LIMITS)
    assert not preemptible(edge, NOW_MS, **(LIMITS | {"ms_per_token": 10.01}))
    assert preemptible(
        job("v", deadline_ms=NOW_MS + 60_000, tokens_left=10**6), NOW_MS, **(LIMITS | {"ms_per_token": 0.0})
    )


def test_max_preemptions_zero_turns_preemption_off():
    off = LIMITS | {"max_preemptions": 0}
    assert choose_victims([job("d")], [job("i", INTERACTIVE)], 0, NOW_MS, **off) == []
    assert preemptible_sequences([job("d", sequences=3)], NOW_MS, **LIMITS) == 3
    assert preemptible_sequences([job("d", sequences=3)], NOW_MS, **off) == 0

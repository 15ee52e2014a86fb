"""The result-router's batch-job decisions: settling results, retry rounds, ending lines, and the driver's plan."""

import msgspec
import pytest

from llmq_core import wire
from llmq_core.status import ErrorCode
from llmq_jobs import jobs
from llmq_jobs.jobs import JobView
from llmq_result_router import jobpolicy
from llmq_result_router.jobpolicy import Step
from tests.builders import job_spec

BATCH = "batch_x"
NOW_MS = 1_700_000_000_000
GRACE_MS = 5000


def result(outcome=wire.Outcome.SUCCEEDED, round_=0, custom_id="c1", error=None, usage=(7, 5)):
    return wire.FinalResult(
        request_id=jobs.line_request_id(BATCH, custom_id, round_),
        outcome=outcome,
        model="llmq-sim",
        reply_to=wire.JobReply(batch_id=BATCH, custom_id=custom_id),
        error=error,
        usage=wire.Usage(prompt_tokens=usage[0], completion_tokens=usage[1], total_tokens=sum(usage)),
    )


def settle(res, state, max_rounds=3, backoff_ms=1000):
    return jobpolicy.settle_result(res, state, max_rounds=max_rounds, backoff_ms=backoff_ms, now_ms=NOW_MS)


SERVER_ERROR = wire.ErrorInfo(type="engine_error", message="boom", retryable=True)
INVALID = wire.ErrorInfo(type="invalid_request_error", message="too long")


def test_success_settles_with_usage_counters():
    s = settle(result(), jobs.pending(0))
    assert (s.expected, s.new) == ("p0", jobs.SUCCEEDED)
    assert s.counters == {"succeeded": 1, "input_tokens": 7, "output_tokens": 5}
    assert s.result is not None and s.retry_due_ms is None and not s.dead_letter


def test_retryable_errors_retry_with_doubling_backoff_then_become_dead_letters():
    dues = []
    for round_ in range(3):
        s = settle(result(wire.Outcome.ERRORED, round_, error=SERVER_ERROR), jobs.pending(round_))
        assert s.new == jobs.retry(round_ + 1) and s.counters == {"retried": 1} and s.result is None
        dues.append(s.retry_due_ms - NOW_MS)
    assert dues == [1000, 2000, 4000]
    last = settle(result(wire.Outcome.ERRORED, 3, error=SERVER_ERROR), jobs.pending(3))
    assert last.new == jobs.ERRORED and last.dead_letter
    assert last.counters == {"errored": 1, "dead_letters": 1}


def test_invalid_requests_are_never_retried():
    s = settle(result(wire.Outcome.ERRORED, error=INVALID), jobs.pending(0))
    assert s.new == jobs.ERRORED and s.counters == {"errored": 1} and not s.dead_letter


def test_zero_rounds_means_no_retry():
    s = settle(result(wire.Outcome.ERRORED, error=SERVER_ERROR), jobs.pending(0), max_rounds=0)
    assert s.new == jobs.ERRORED and s.dead_letter


@pytest.mark.parametrize(
    "outcome,state,counter",
    [(wire.Outcome.CANCELED, jobs.CANCELED, "canceled"), (wire.Outcome.EXPIRED, jobs.LINE_EXPIRED, "expired")],
)
def test_canceled_and_expired_results_are_not_billed(outcome, state, counter):
    s = settle(result(outcome), jobs.pending(0))
    assert s.new == state and s.counters == {counter: 1}


@pytest.mark.parametrize("state", [jobs.SUCCEEDED, jobs.ERRORED, jobs.CANCELED, jobs.retry(1), None])
def test_a_result_for_a_line_not_pending_changes_nothing(state):
    assert settle(result(), state) is None


def test_a_result_of_an_older_round_is_stale():
    assert settle(result(round_=0), jobs.pending(1)) is None
    assert settle(result(round_=1), jobs.pending(1)).new == jobs.SUCCEEDED


def test_results_of_other_reply_kinds_are_ignored():
    other = msgspec.structs.replace(result(), reply_to=wire.HttpReply(instance_id="pod"))
    assert settle(other, jobs.pending(0)) is None


def test_end_line_makes_an_unbilled_result_with_the_batch_code():
    s = jobpolicy.end_line(BATCH, "c9", jobs.retry(2), wire.Outcome.CANCELED, NOW_MS)
    assert (s.expected, s.new, s.counters) == ("r2", jobs.CANCELED, {"canceled": 1})
    assert s.result.request_id == jobs.line_request_id(BATCH, "c9", 2)
    assert s.result.error.code == ErrorCode.BATCH_CANCELLED and s.result.usage.total_tokens == 0
    assert (
        jobpolicy.end_line(BATCH, "c9", jobs.pending(0), wire.Outcome.EXPIRED, NOW_MS).result.error.code
        == ErrorCode.BATCH_EXPIRED
    )
    assert jobpolicy.end_line(BATCH, "c9", jobs.SUCCEEDED, wire.Outcome.CANCELED, NOW_MS) is None


def job(status=jobs.IN_PROGRESS, total=10, runnable=8, end_ms=0, **counts):
    spec = job_spec(
        BATCH,
        input_file_id="f",
        completion_window="1h",
        created_ms=NOW_MS - 1000,
        expires_ms=NOW_MS + 60_000,
        output_file_id="o",
        error_file_id="e",
        total=total,
        runnable=runnable,
    )
    counts.setdefault("errored", total - runnable)  # lines that failed validation
    return JobView(spec=spec, status=status, counts=counts, end_ms=end_ms)


def test_plan_runs_until_every_line_is_settled_then_finalizes_completed():
    assert jobpolicy.plan_job(job(succeeded=7), NOW_MS, GRACE_MS).step is Step.RUN
    plan = jobpolicy.plan_job(job(succeeded=8), NOW_MS, GRACE_MS)
    assert (plan.step, plan.final_status) == (Step.FINALIZE, jobs.COMPLETED)
    assert jobpolicy.plan_job(job(jobs.FINALIZING), NOW_MS, GRACE_MS).final_status == jobs.COMPLETED


def test_plan_after_the_window_winds_down_then_forces_then_ends_expired():
    expires_ms = NOW_MS + 60_000
    wind = jobpolicy.plan_job(job(succeeded=3), expires_ms, GRACE_MS)
    assert (wind.step, wind.outcome) == (Step.WIND_DOWN, wire.Outcome.EXPIRED)
    assert jobpolicy.plan_job(job(succeeded=3), expires_ms + GRACE_MS, GRACE_MS).step is Step.FORCE_END
    done = jobpolicy.plan_job(job(succeeded=3, expired=5), expires_ms + GRACE_MS, GRACE_MS)
    assert (done.step, done.final_status) == (Step.FINALIZE, jobs.EXPIRED)


def test_plan_of_a_cancel_winds_down_for_the_grace_then_ends_cancelled():
    cancelling = job(jobs.CANCELLING, end_ms=NOW_MS, succeeded=1)
    assert jobpolicy.plan_job(cancelling, NOW_MS + 1, GRACE_MS).outcome is wire.Outcome.CANCELED
    assert jobpolicy.plan_job(cancelling, NOW_MS + 1, GRACE_MS).step is Step.WIND_DOWN
    assert jobpolicy.plan_job(cancelling, NOW_MS + GRACE_MS, GRACE_MS).step is Step.FORCE_END
    done = job(jobs.CANCELLING, end_ms=NOW_MS, succeeded=1, canceled=7)
    assert jobpolicy.plan_job(done, NOW_MS + 1, GRACE_MS).final_status == jobs.CANCELLED


@pytest.mark.parametrize("status", sorted(jobs.TERMINAL_STATUSES))
def test_plan_leaves_ended_jobs_alone(status):
    assert jobpolicy.plan_job(job(status), NOW_MS, GRACE_MS).step is Step.NONE


def test_in_flight_counts_produced_unsettled_lines_not_waiting_retries():
    assert jobpolicy.in_flight(job(produced=6, succeeded=2), waiting_retries=1) == 3
    assert jobpolicy.in_flight(job(produced=0), waiting_retries=0) == 0


def test_produced_means_pending_and_behind_the_cursor_or_a_retry_round():
    assert jobpolicy.produced(jobs.pending(0), start=10, cursor=20)
    assert not jobpolicy.produced(jobs.pending(0), start=20, cursor=20)
    assert jobpolicy.produced(jobs.pending(1), start=50, cursor=20)
    assert not jobpolicy.produced(jobs.retry(1), start=0, cursor=20)

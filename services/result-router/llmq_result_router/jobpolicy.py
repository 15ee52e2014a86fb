"""Batch-job decisions, free of I/O: what a line's result does to the ledger, and what a job's driver does next.

Retry rounds: a line whose run errored with ``retryable`` set runs again, up to ``max_rounds`` more times, round ``r``
(1-based) after ``backoff_ms * 2**(r-1)``; one still failing after the last round is a dead letter. Errors that are
not retryable (invalid requests, a request that broke the engine) end the line at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llmq_core import wire
from llmq_core.status import ErrorCode, ErrorType
from llmq_jobs import jobs
from llmq_jobs.jobs import JobView
from llmq_jobs.store import LineChange

UNKNOWN_JOB = "unknown_job"  # forged_results reason: no job has that batch id
OTHER_TENANT = "other_tenant"  # ... the job is another tenant's
NOT_A_LINE_ID = "not_a_line_id"  # ... the request id is no run of that line (llmq derives it from batch and line)


def forgery(result: wire.FinalResult, job_tenant: str | None) -> str | None:
    """Why a line result on llmq.results cannot be one llmq dispatched (a forgery: dropped unstored), given the tenant
    of the job it names (None: no such job); None when it may be. Which round (attempt) it answers is
    :func:`settle_result`'s check: a result of an older round changes nothing."""
    reply = result.reply_to
    if job_tenant is None:
        return UNKNOWN_JOB
    if result.tenant_id != job_tenant:
        return OTHER_TENANT
    base = jobs.line_request_id(reply.batch_id, reply.custom_id)
    suffix = result.request_id.removeprefix(base)
    if suffix and not (suffix[0] == ":" and suffix[1:].isdigit()):
        return NOT_A_LINE_ID
    return None


def settle_result(
    result: wire.FinalResult, state: str | None, *, max_rounds: int, backoff_ms: int, now_ms: int
) -> LineChange | None:
    """The ledger change for a line's result, given the line's current state; None when the result changes
    nothing (the line is settled already or waits for a retry, the result is from an older round, unknown line)."""
    reply = result.reply_to
    if state is None or not isinstance(reply, wire.JobReply):
        return None
    code, round_ = jobs.parse_state(state)
    if code != jobs.PENDING or result.request_id != jobs.line_request_id(reply.batch_id, reply.custom_id, round_):
        return None
    outcome = result.outcome
    if outcome is wire.Outcome.SUCCEEDED:
        usage = result.usage
        return LineChange(
            reply.custom_id,
            state,
            jobs.SUCCEEDED,
            result,
            counters={
                jobs.STATE_COUNTER[jobs.SUCCEEDED]: 1,
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
            },
        )
    retryable = outcome is wire.Outcome.ERRORED and result.error is not None and result.error.retryable
    if retryable and round_ < max_rounds:
        due_ms = now_ms + backoff_ms * 2**round_
        return LineChange(reply.custom_id, state, jobs.retry(round_ + 1), retry_due_ms=due_ms, counters={"retried": 1})
    new = jobs.OUTCOME_STATE[outcome]
    counters = {jobs.STATE_COUNTER[new]: 1}
    if retryable:
        counters["dead_letters"] = 1
    return LineChange(reply.custom_id, state, new, result, counters=counters, dead_letter=retryable)


def end_line(batch_id: str, custom_id: str, state: str, outcome: wire.Outcome, now_ms: int) -> LineChange | None:
    """End a line that has no result yet as ``canceled`` or ``expired`` (the job was cancelled or ran out of time);
    None for a settled line. The result carries no usage: such a line is never billed."""
    code, round_ = jobs.parse_state(state)
    if code in jobs.TERMINAL_LINE_STATES:
        return None
    new = jobs.OUTCOME_STATE[outcome]
    cancelled = outcome is wire.Outcome.CANCELED
    error = wire.ErrorInfo(
        type=ErrorType.BATCH_CANCELLED if cancelled else ErrorType.BATCH_EXPIRED,
        code=ErrorCode.BATCH_CANCELLED if cancelled else ErrorCode.BATCH_EXPIRED,
        message="This line was cancelled with its batch"
        if cancelled
        else "This line did not run before the batch's completion window ended",
    )
    result = jobs.unrun_line_result(batch_id, custom_id, outcome, error, finished_ms=now_ms, round_=round_)
    return LineChange(custom_id, state, new, result, counters={jobs.STATE_COUNTER[new]: 1})


class Step(enum.Enum):
    """What the driver does with a job now."""

    RUN = "run"  # produce lines (round 0 and due retries) into the in-flight window
    WIND_DOWN = "wind_down"  # cancelled or out of time: end lines that are not running, wait for running ones
    FORCE_END = "force_end"  # the grace is over: end every line without a result
    FINALIZE = "finalize"  # every line is settled: write the results, enter the final status
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Plan:
    step: Step
    final_status: str | None = None  # FINALIZE: the status to end in
    outcome: wire.Outcome | None = None  # WIND_DOWN / FORCE_END: what unfinished lines become


def plan_job(job: JobView, now_ms: int, grace_ms: int) -> Plan:
    """The driver's next step for ``job`` at ``now_ms``; ``grace_ms`` is how long running lines may still finish
    after a cancel or after the completion window."""
    status = job.status
    if status == jobs.FINALIZING:
        return Plan(Step.FINALIZE, final_status=jobs.COMPLETED)
    if status == jobs.CANCELLING:
        return _ending(job, jobs.CANCELLED, wire.Outcome.CANCELED, job.end_ms + grace_ms, now_ms)
    if status != jobs.IN_PROGRESS:
        return Plan(Step.NONE)
    if now_ms < job.spec.expires_ms:
        return Plan(Step.FINALIZE, final_status=jobs.COMPLETED) if job.done else Plan(Step.RUN)
    return _ending(job, jobs.EXPIRED, wire.Outcome.EXPIRED, job.spec.expires_ms + grace_ms, now_ms)


def _ending(job: JobView, final_status: str, outcome: wire.Outcome, force_ms: int, now_ms: int) -> Plan:
    if job.done:
        return Plan(Step.FINALIZE, final_status=final_status)
    return Plan(Step.FORCE_END if now_ms >= force_ms else Step.WIND_DOWN, outcome=outcome)


def in_flight(job: JobView, waiting_retries: int) -> int:
    """Lines produced and not settled, not counting lines waiting for a retry round."""
    settled_runnable = job.settled - (job.spec.total - job.spec.runnable)
    return max(0, job.count("produced") - settled_runnable - waiting_retries)


def produced(state: str, start: int, cursor: int) -> bool:
    """Whether a line in ``state`` whose prepared bytes start at ``start`` has gone out (and may be running)."""
    code, round_ = jobs.parse_state(state)
    return code == jobs.PENDING and (round_ > 0 or start < cursor)

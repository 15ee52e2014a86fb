"""Anthropic shapes of batch jobs (``/v1/messages/batches``): the ``message_batch`` object and the results' lines.
Pure. The job engine's statuses and line outcomes map onto Anthropic's as docs/anthropic.md lists them."""

from __future__ import annotations

from datetime import UTC, datetime

from llmq_core import wire
from llmq_jobs import jobs
from llmq_jobs.jobs import JobView

_PROCESSING = {jobs.CANCELLING: "canceling", **{status: "ended" for status in jobs.TERMINAL_STATUSES}}
OUTCOMES = tuple(outcome.value for outcome in wire.Outcome)  # succeeded, errored, canceled, expired


def processing_status(job: JobView) -> str:
    """``in_progress`` (validating, in_progress, finalizing), ``canceling``, or ``ended`` (any terminal status)."""
    return _PROCESSING.get(job.status, "in_progress")


def results_ready(job: JobView) -> bool:
    """Whether the batch's results may be asked for: once it ended, or (waiting for it to end) while it cancels."""
    return processing_status(job) != "in_progress"


def timestamp(epoch_s: float | None) -> str | None:
    """RFC 3339 in UTC, as Anthropic writes its times."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_batch(job: JobView, results_url: str) -> dict:
    """The ``message_batch`` object; ``results_url`` is given once :func:`results_ready`. ``request_counts`` are
    live (Anthropic's count every request as processing until the batch ends): the lines settled so far."""
    status = processing_status(job)
    settled = {outcome: job.count(outcome) for outcome in OUTCOMES}
    ended = job.times.get(job.status) if status == "ended" else None
    return {
        "id": job.spec.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {"processing": max(0, job.spec.total - sum(settled.values())), **settled},
        "created_at": timestamp(job.spec.created_ms / 1000),
        "ended_at": timestamp(ended),
        "expires_at": timestamp(job.spec.expires_ms / 1000),
        "cancel_initiated_at": timestamp(job.times.get(jobs.CANCELLING)),
        "archived_at": None,  # an ended batch is kept whole for its retention, then forgotten (404)
        "results_url": results_url if results_ready(job) else None,
    }

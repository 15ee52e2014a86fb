"""OpenAI shapes of batch jobs: the ``batch`` and ``file`` objects, and output / error file lines. Pure."""

from __future__ import annotations

from llmq_jobs import jobs
from llmq_jobs.jobs import FileRecord, JobView

_TIMESTAMPS = jobs.STATUSES[1:]  # every status but validating has its <status>_at


def batch_object(job: JobView) -> dict:
    """The OpenAI ``batch`` object; ``llmq`` adds per-outcome line counts, retries, dead letters and
    ``owner_region``: the region that drives the job (its highest claim; another region than the one asked when the
    job moved there, whose progress this view then follows), None when none is recorded."""
    spec = job.spec
    failed = job.status == jobs.FAILED
    counts = job.counts
    input_tokens, output_tokens = job.count("input_tokens"), job.count("output_tokens")
    succeeded = job.count(jobs.STATE_COUNTER[jobs.SUCCEEDED])
    # OpenAI's error_file_id of a batch that ended with every line succeeded is null (no file with nothing in it)
    no_errors = failed or (job.status in jobs.TERMINAL_STATUSES and succeeded == spec.total)
    body = {
        "id": spec.id,
        "object": "batch",
        "endpoint": spec.endpoint,
        "model": None,
        "errors": {"object": "list", "data": [_error(e) for e in job.errors]} if job.errors else None,
        "input_file_id": spec.input_file_id,
        "completion_window": spec.completion_window,
        "status": job.status,
        "output_file_id": None if failed else spec.output_file_id,
        "error_file_id": None if no_errors else spec.error_file_id,
        "created_at": spec.created_ms // 1000,
        "expires_at": spec.expires_ms // 1000,
        **{f"{name}_at": job.times.get(name) for name in _TIMESTAMPS},
        "request_counts": {
            "total": spec.total,
            "completed": succeeded,
            "failed": job.settled - succeeded,
        },
        "metadata": spec.metadata,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": job.count("cached_tokens")},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
        "llmq": {
            **{name: counts.get(name, 0) for name in (*jobs.STATE_COUNTER.values(), "retried", "dead_letters")},
            "owner_region": job.owner_region or None,
        },
    }
    return body


def _error(error: jobs.LineError) -> dict:
    return {"code": error.code, "message": error.message, "param": error.param, "line": error.line}


def file_object(record: FileRecord) -> dict:
    """The OpenAI ``file`` object."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": record.expires_at,
        "status_details": None,
    }

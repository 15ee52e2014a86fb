"""The old region's view of a moved job is rebuilt as ended only once the new owner's record has ended and its
ledger holds every line: its specs and ledger topics are mirrored independently, so either may arrive last."""

from llmq_jobs import jobs
from llmq_jobs.jobs import JobRecord
from llmq_result_router.moved import ended
from tests.builders import job_spec

SPEC = job_spec("batch_b-1", total=3)


def record(status: str) -> JobRecord:
    return JobRecord(spec=SPEC, status=status)


def test_an_ended_record_with_every_line_settled_is_the_final_view():
    assert ended(record(jobs.COMPLETED), 3)
    assert ended(record(jobs.CANCELLED), 3)


def test_an_ended_record_ahead_of_its_last_results_is_not_yet():
    assert not ended(record(jobs.COMPLETED), 2)


def test_a_running_job_or_no_record_is_not_ended_whatever_its_ledger():
    assert not ended(record(jobs.FINALIZING), 3)
    assert not ended(None, 3)

"""OpenAI shapes of batches, files, and output / error lines."""

import pytest

from llmq_api.batch_jobs import render
from llmq_core import wire
from llmq_jobs import jobs, lines
from llmq_jobs.jobs import FileRecord, JobView, LineError
from tests.builders import job_spec

BATCH = "batch_r"


def result(outcome=wire.Outcome.SUCCEEDED, endpoint="chat.completions", error=None):
    return wire.FinalResult(
        request_id=jobs.line_request_id(BATCH, "c1"),
        outcome=outcome,
        model="llmq-sim",
        endpoint=endpoint,
        reply_to=wire.JobReply(batch_id=BATCH, custom_id="c1"),
        error=error,
        choices=[wire.Choice(index=0, text="hello", finish_reason="length")],
        usage=wire.Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8),
        created_ms=1_700_000_000_000,
    )


def test_a_succeeded_chat_line_carries_the_chat_completion():
    succeeded, line = lines.output_line(result())
    assert succeeded
    assert line["custom_id"] == "c1" and line["error"] is None and line["id"].startswith("batch_req_")
    response = line["response"]
    assert response["status_code"] == 200 and response["request_id"] == f"{BATCH}:c1"
    assert response["body"]["object"] == "chat.completion"
    assert response["body"]["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert response["body"]["usage"]["total_tokens"] == 8


def test_a_succeeded_completions_line_carries_a_text_completion():
    _, line = lines.output_line(result(endpoint="completions"))
    assert line["response"]["body"]["object"] == "text_completion"
    assert line["response"]["body"]["choices"][0]["text"] == "hello"


@pytest.mark.parametrize(
    "error,status,dead",
    [
        (wire.ErrorInfo(type="invalid_request_error", message="bad", code="x"), 400, False),
        (wire.ErrorInfo(type="invalid_request_error", message="no model", code="model_not_found"), 404, False),
        (wire.ErrorInfo(type="engine_error", message="boom", retryable=True), 503, True),
        (wire.ErrorInfo(type="engine_error", message="poison", code="poison"), 500, False),
    ],
)
def test_errored_lines_carry_the_http_status_and_openai_error_body(error, status, dead):
    succeeded, line = lines.output_line(result(wire.Outcome.ERRORED, error=error))
    assert not succeeded
    assert line["response"]["status_code"] == status
    assert line["response"]["body"]["error"]["message"] == error.message
    assert line.get("dead_letter", False) is dead


@pytest.mark.parametrize(
    "outcome,code", [(wire.Outcome.CANCELED, "batch_cancelled"), (wire.Outcome.EXPIRED, "batch_expired")]
)
def test_cancelled_and_expired_lines_carry_an_error_and_no_response(outcome, code):
    succeeded, line = lines.output_line(result(outcome))
    assert not succeeded
    assert line["response"] is None and line["error"]["code"] == code


def view(status, errors=(), **counts):
    spec = job_spec(
        BATCH,
        endpoint="/v1/chat/completions",
        completion_window="6h",
        created_ms=1_700_000_000_500,
        expires_ms=1_700_021_600_500,
        metadata={"k": "v"},
        output_file_id="file-out",
        error_file_id="file-err",
        total=10,
        runnable=9,
    )
    return JobView(spec=spec, status=status, times={"in_progress": 1_700_000_001}, counts=counts, errors=list(errors))


def test_batch_object_counts_and_usage():
    body = render.batch_object(
        view(
            jobs.IN_PROGRESS,
            succeeded=4,
            errored=1,
            canceled=2,
            expired=1,
            input_tokens=40,
            output_tokens=20,
            retried=3,
            dead_letters=1,
        )
    )
    assert body["object"] == "batch" and body["status"] == "in_progress"
    assert (body["created_at"], body["expires_at"], body["in_progress_at"]) == (
        1_700_000_000,
        1_700_021_600,
        1_700_000_001,
    )
    assert body["completed_at"] is None and body["errors"] is None
    assert body["request_counts"] == {"total": 10, "completed": 4, "failed": 4}
    assert body["usage"]["total_tokens"] == 60 and body["usage"]["input_tokens"] == 40
    assert (body["output_file_id"], body["error_file_id"]) == ("file-out", "file-err")
    assert body["llmq"]["retried"] == 3 and body["llmq"]["dead_letters"] == 1
    assert body["metadata"] == {"k": "v"}


def test_a_failed_batch_lists_its_errors_and_has_no_files():
    error = LineError(code="invalid_json_line", message="nope", line=3)
    body = render.batch_object(view(jobs.FAILED, errors=[error]))
    assert body["errors"] == {
        "object": "list",
        "data": [{"code": "invalid_json_line", "message": "nope", "param": None, "line": 3}],
    }
    assert body["output_file_id"] is None and body["error_file_id"] is None


def test_a_batch_that_ended_with_every_line_succeeded_has_no_error_file():
    """OpenAI's error_file_id is null then (it pointed at an empty file); one with a failed line keeps it."""
    body = render.batch_object(view(jobs.COMPLETED, succeeded=10))
    assert body["output_file_id"] == "file-out" and body["error_file_id"] is None
    assert render.batch_object(view(jobs.COMPLETED, succeeded=9, errored=1))["error_file_id"] == "file-err"
    assert render.batch_object(view(jobs.CANCELLED, succeeded=4, canceled=6))["error_file_id"] == "file-err"


def test_file_object():
    record = FileRecord(
        id="file-1",
        tenant_id="t",
        filename="in.jsonl",
        purpose="batch",
        bytes=12,
        created_at=5,
        expires_at=9,
        path="files/file-1",
    )
    assert render.file_object(record) == {
        "id": "file-1",
        "object": "file",
        "bytes": 12,
        "created_at": 5,
        "filename": "in.jsonl",
        "purpose": "batch",
        "status": "processed",
        "expires_at": 9,
        "status_details": None,
    }

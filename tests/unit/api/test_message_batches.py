"""Message Batches at the edge, pure: the create body split into requests as it streams (any chunking, bounded
memory), each request as the engine's input line, and the batch and result shapes validated strictly against the
pinned anthropic SDK's models."""

from __future__ import annotations

import json

import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from pydantic import BaseModel

from llmq_api.batch_jobs import inputs, message_render
from llmq_api.batch_jobs.message_requests import MAX_OPENING_BYTES, RequestSplitter, input_line
from llmq_api.errors import ApiError
from llmq_core import wire
from llmq_jobs import jobs, lines
from llmq_jobs.jobs import JobView
from tests.builders import generation_request, job_spec
from tests.fake_results import fake_result

TRICKY = 'he said "}{][\\" and \\\\ left ✓'


def entries(n: int) -> list[dict]:
    return [
        {
            "custom_id": f"c{i}",
            "params": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": TRICKY * i}]},
        }
        for i in range(n)
    ]


def split(body: bytes, size: int, max_bytes: int = 1 << 20) -> list[bytes]:
    splitter = RequestSplitter(max_bytes)
    out = []
    for start in range(0, len(body), size):
        out += splitter.feed(body[start : start + size])
    return out + splitter.end()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_requests_split_out_whole_whatever_the_chunks(size, indent):
    requests = entries(12)
    body = json.dumps({"requests": requests}, indent=indent, ensure_ascii=False).encode()
    assert [json.loads(r) for r in split(body, size)] == requests


def test_the_splitter_keeps_one_request_at_a_time():
    body = json.dumps({"requests": entries(40)}).encode()
    largest = max(len(json.dumps(e)) for e in entries(40))
    assert len(split(body, 7, max_bytes=largest + 8)) == 40
    with pytest.raises(ApiError) as raised:
        split(body, 7, max_bytes=largest // 2)
    assert raised.value.status == 413 and raised.value.param.startswith("requests[")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"requests": {}}', "requests"),
        (b'{"model": "m", "requests": []}', "requests"),
        (b'{"requests": [{"custom_id": "a"} {"custom_id": "b"}]}', "requests[1]"),
        (b'{"requests": [{"custom_id": "a"},]}', "requests[1]"),
        (b'{"requests": [], "more": 1}', "requests"),
        (b'{"requests": [{"custom_id": "a"}', "requests"),
        (b"", "requests"),
        (b'{"requests": [1]}', "requests[0]"),
    ],
)
def test_a_body_of_another_shape_is_a_400_naming_where(body, param):
    with pytest.raises(ApiError) as raised:
        split(body, 3)
    assert raised.value.status == 400 and raised.value.param == param


def test_a_long_opening_is_refused_once_it_cannot_be_the_requests_array():
    with pytest.raises(ApiError):
        RequestSplitter(100).feed(b" " * (MAX_OPENING_BYTES + 1))


def test_a_request_becomes_the_engines_input_line_and_its_faults_are_structural():
    checker = inputs.InputChecker(jobs.MESSAGES_ENDPOINT, {"m": 100}, inputs.Limits(10, 1 << 20))
    requests = [*entries(2), {"custom_id": "c0", "params": {}}, {"custom_id": "a b", "params": {}}, {"custom_id": "p"}]
    lines = [line for i, r in enumerate(requests) for line in checker.check(input_line(i, json.dumps(r).encode()))]
    assert [(line.custom_id, line.valid is not None) for line in lines] == [("c0", True), ("c1", True)]
    codes = [(e.code, e.line) for e in checker.checked.errors]
    assert codes == [("duplicate_custom_id", 3), ("invalid_custom_id", 4), ("invalid_body", 5)]
    with pytest.raises(ApiError) as raised:
        input_line(7, b'{"custom_id": "x", "params": {}, "extra": 1}')
    assert raised.value.param == "requests[7]"


def strict(model: type[BaseModel], body: dict):
    parsed = model.model_validate_json(json.dumps(body), strict=True)
    pending = [parsed]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseModel):
            assert not item.model_extra, item.model_extra
            pending += [getattr(item, name) for name in type(item).model_fields]
        elif isinstance(item, list):
            pending += item
    return parsed


@pytest.mark.parametrize(
    ("status", "processing"),
    [(jobs.IN_PROGRESS, "in_progress"), (jobs.FINALIZING, "in_progress"), (jobs.CANCELLING, "canceling")]
    + [(status, "ended") for status in (jobs.COMPLETED, jobs.EXPIRED, jobs.CANCELLED)],
)
def test_the_batch_object_validates_in_every_status(status, processing):
    spec = job_spec(total=5, created_ms=1_700_000_000_123, expires_ms=1_700_086_400_123)
    times = {jobs.IN_PROGRESS: 1_700_000_000, jobs.CANCELLING: 1_700_000_010, status: 1_700_000_020}
    counts = {"succeeded": 1, "errored": 1, "canceled": 1}
    job = JobView(spec=spec, status=status, times=times, counts=counts)
    batch = strict(MessageBatch, message_render.message_batch(job, "http://h/v1/messages/batches/x/results"))
    assert batch.processing_status == processing
    assert batch.request_counts.processing == 2 and batch.request_counts.expired == 0
    assert batch.created_at.timestamp() == pytest.approx(1_700_000_000.123)
    assert (batch.ended_at is not None) == (processing == "ended")
    assert (batch.results_url is not None) == (processing != "in_progress")


def test_each_result_type_validates():
    request = generation_request(
        "b1:x",
        reply_to=wire.JobReply(batch_id="b1", custom_id="x"),
        prompt=None,
        messages=[wire.ChatMessage(role="user", content="hi")],
    )
    succeeded = lines.result_line(fake_result(request, wire.Outcome.SUCCEEDED, "hi"))
    invalid = wire.ErrorInfo(type="invalid_request_error", message="bad", param="temperature")
    errored = lines.result_line(fake_result(request, wire.Outcome.ERRORED, error=invalid))
    lost = wire.ErrorInfo(type="engine_error", message="worker lost", retryable=True)
    dead = lines.result_line(fake_result(request, wire.Outcome.ERRORED, error=lost))
    ended = [
        lines.result_line(fake_result(request, outcome)) for outcome in (wire.Outcome.CANCELED, wire.Outcome.EXPIRED)
    ]
    parsed = [strict(MessageBatchIndividualResponse, line) for line in (succeeded, errored, dead, *ended)]
    assert [p.result.type for p in parsed] == ["succeeded", "errored", "errored", "canceled", "expired"]
    assert parsed[0].custom_id == "x" and parsed[0].result.message.usage.service_tier == "batch"
    assert parsed[0].result.message.id.startswith("msg_")
    assert (
        parsed[1].result.error.error.type == "invalid_request_error"
        and "temperature" in parsed[1].result.error.error.message
    )
    assert parsed[2].result.error.error.type == "api_error"

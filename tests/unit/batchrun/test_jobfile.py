"""The job file is checked whole, with line numbers, before anything is uploaded; ids can be built from fields."""

import json

import pytest

from llmq_cli.batchrun.jobfile import IdTemplate, JobFileError, read_job, shard_file, upload_line


def request(cid=None, **extra) -> dict:
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}, **extra}
    return {"custom_id": cid, **line} if cid is not None else line


def write(tmp_path, lines) -> object:
    path = tmp_path / "job.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_a_clean_job_keeps_each_line_with_its_number_and_upload_size(tmp_path):
    path = write(tmp_path, [request("a", doc="x"), "", request("b")])
    job = read_job(path)
    assert [(line.number, line.custom_id) for line in job.lines] == [(1, "a"), (3, "b")]
    assert job.endpoint == "/v1/chat/completions"
    data = shard_file(job, job.lines, None)
    assert len(data) == sum(line.upload_bytes for line in job.lines)
    assert [json.loads(x) for x in data.splitlines()][0] == {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": []},
    }  # extra fields (doc) stay out of the upload


def test_every_offender_is_named_by_its_line_number(tmp_path):
    path = write(
        tmp_path,
        [
            request("ok-1"),
            request("has space"),
            request("x" * 65),
            request("ok-1"),
            "{not json",
            {"custom_id": "no-body", "url": "/v1/chat/completions"},
            request("other-url") | {"url": "/v1/completions"},
            request(7),
        ],
    )
    with pytest.raises(JobFileError) as refused:
        read_job(path)
    problems = {p.line: p.message for p in refused.value.problems}
    assert refused.value.count == 7 and sorted(problems) == [2, 3, 4, 5, 6, 7, 8]
    assert "1-64 characters" in problems[2] and "1-64 characters" in problems[3] and "1-64" in problems[8]
    assert "repeats line 1" in problems[4]
    assert "JSON" in problems[5] and "body" in problems[6] and "endpoint" in problems[7]


def test_an_empty_job_is_refused(tmp_path):
    with pytest.raises(JobFileError):
        read_job(write(tmp_path, ["", "  "]))


def test_an_id_template_builds_ids_from_fields_also_nested_ones(tmp_path):
    template = IdTemplate("{doc_id}-v{meta.version}")
    path = write(tmp_path, [request(doc_id="d1", meta={"version": 2}), request(doc_id="d2", meta={"version": 2})])
    job = read_job(path, template)
    assert [line.custom_id for line in job.lines] == ["d1-v2", "d2-v2"]
    uploaded = [json.loads(x)["custom_id"] for x in shard_file(job, job.lines, template).splitlines()]
    assert uploaded == ["d1-v2", "d2-v2"]
    assert job.digest != read_job(path, IdTemplate("{doc_id}-w{meta.version}")).digest


def test_a_template_id_missing_a_field_or_colliding_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, [request(doc_id="d1"), request(), request(doc_id="d1"), request(doc_id={"a": 1})])
    with pytest.raises(JobFileError) as refused:
        read_job(path, IdTemplate("{doc_id}"))
    assert [p.line for p in refused.value.problems] == [2, 3, 4]


def test_a_template_needs_a_named_field():
    for bad in ("plain", "{}-x"):
        with pytest.raises(ValueError):
            IdTemplate(bad)


def test_upload_lines_are_exactly_sized():
    line = upload_line(request("é"), "é")
    assert line.endswith(b"\n") and "é".encode() in line

"""``llmq batch run`` as a command: refusals before anything is uploaded, and the summary and exit status of a run
(against the in-memory batch API in place of the HTTP one)."""

import json

import pytest
from typer.testing import CliRunner

from llmq_cli.batchrun import command
from llmq_cli.batchrun.api import OpenAIBatchApi, limits_of
from llmq_cli.batchrun.shard import ShardLimits
from llmq_cli.main import app
from tests.unit.batchrun.fakes import FakeBatchApi, failed, ok

UNREACHABLE = ["--base-url", "http://127.0.0.1:9/v1"]  # never called: these runs stop before the API


def write_job(path, ids):
    line = {"url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
    path.write_text("".join(json.dumps({"custom_id": cid, **line}) + "\n" for cid in ids))
    return path


def invoke(*args):
    return CliRunner().invoke(app, ["batch", "run", *map(str, args)], env={"COLUMNS": "200"})


def test_a_job_with_bad_ids_is_refused_with_line_numbers_and_nothing_is_started(tmp_path):
    job = write_job(tmp_path / "job.jsonl", ["ok", "bad id", "ok"])
    done = invoke(job, "--output", tmp_path / "out.jsonl", *UNREACHABLE)
    assert done.exit_code == 2
    assert (
        "2 line(s)" in done.output
        and "line 2:" in done.output
        and "line 3: custom_id 'ok' repeats line 1" in done.output
    )
    assert not (tmp_path / "out.jsonl.state").exists()
    as_json = invoke(job, "--output", tmp_path / "out.jsonl", "--json", *UNREACHABLE)
    assert [p["line"] for p in json.loads(as_json.stdout)["error"]["lines"]] == [2, 3]


def test_a_state_folder_of_another_job_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "OpenAIBatchApi", lambda *_: FakeBatchApi())
    first = invoke(
        write_job(tmp_path / "a.jsonl", ["a"]), "--output", tmp_path / "out.jsonl", "--poll-interval-s", 0.05
    )
    assert first.exit_code == 0, first.output
    other = invoke(write_job(tmp_path / "b.jsonl", ["b"]), "--output", tmp_path / "out.jsonl", *UNREACHABLE)
    assert other.exit_code == 2 and "another job" in other.output


def test_a_broken_schema_is_a_usage_error(tmp_path):
    (tmp_path / "schema.json").write_text('{"type": 12}')
    job = write_job(tmp_path / "job.jsonl", ["a"])
    done = invoke(job, "--output", tmp_path / "out.jsonl", "--json-schema", tmp_path / "schema.json", *UNREACHABLE)
    assert done.exit_code == 2 and not (tmp_path / "out.jsonl.state").exists()


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_prints_its_summary_and_exits_1_with_dead_letters(tmp_path, monkeypatch, as_json):
    answer = lambda cid, _: failed(400, "invalid_value") if cid == "b" else ok('{"a": 1}')  # noqa: E731
    monkeypatch.setattr(command, "OpenAIBatchApi", lambda *_: FakeBatchApi(answer))
    job = write_job(tmp_path / "job.jsonl", ["a", "b", "c"])
    flags = ["--poll-interval-s", 0.05, "--price-input-per-m", 2, "--price-output-per-m", 10, "--deadline", "1h"]
    done = invoke(job, "--output", tmp_path / "out.jsonl", *flags, *(["--json"] if as_json else []))
    assert done.exit_code == 1, done.output
    if as_json:
        report = json.loads(done.stdout)
        assert (report["accepted"], report["dead_lettered"], report["dead_letter_reasons"]) == (
            2,
            1,
            {"invalid_value": 1},
        )
        assert report["time"]["budget_fits_deadline"] is False  # 2 rounds x 24h after a 1h deadline
    else:
        assert "3: 2 accepted, 1 dead-lettered" in done.stdout and "EXCEEDS" in done.stdout
    dead = (tmp_path / "out.dead-letter.jsonl").read_text().splitlines()
    assert [json.loads(line)["custom_id"] for line in dead] == ["b"]


def test_a_target_without_a_limits_route_gets_none_so_openais_limits_apply():
    assert OpenAIBatchApi("http://127.0.0.1:9/v1", "k").limits() is None  # nothing listens there


def test_the_targets_line_limit_is_read_from_its_limits_route():
    batch = {"max_requests": 50, "max_file_bytes": 4096, "max_line_bytes": 1024, "max_completion_window_s": 60}
    assert limits_of(batch) == ShardLimits(50, 4096, max_line_bytes=1024)
    assert limits_of({"max_requests": 50, "max_file_bytes": 4096}) == ShardLimits(50, 4096)
    assert limits_of(["not", "an", "object"]) is None


def fake_target(monkeypatch) -> FakeBatchApi:
    api = FakeBatchApi()
    monkeypatch.setattr(command, "OpenAIBatchApi", lambda *_: api)
    return api


def test_a_corrupt_manifest_ends_in_a_clear_error_and_nothing_runs(tmp_path, monkeypatch):
    api = fake_target(monkeypatch)
    (tmp_path / "out.jsonl.state").mkdir()
    (tmp_path / "out.jsonl.state" / "manifest.sqlite").write_bytes(b"not sqlite at all " * 100)
    done = invoke(write_job(tmp_path / "job.jsonl", ["a"]), "--output", tmp_path / "out.jsonl", "--json")
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit)
    message = json.loads(done.stdout)["error"]["message"]
    assert "is not a readable manifest (file is not a database)" in message and "--restart" in message
    assert api.creates == 0 and api.upload_log == []


def test_an_emptied_manifest_is_refused_unless_restart_runs_the_job_again(tmp_path, monkeypatch):
    api = fake_target(monkeypatch)
    job, out = write_job(tmp_path / "job.jsonl", ["a", "b"]), tmp_path / "out.jsonl"
    assert invoke(job, "--output", out, "--poll-interval-s", 0.05).exit_code == 0
    assert api.creates == 1
    (tmp_path / "out.jsonl.state" / "manifest.sqlite").write_bytes(b"")
    done = invoke(job, "--output", out, "--json")
    message = json.loads(done.stdout)["error"]["message"]
    assert done.exit_code == 2 and "holds no job state" in message and "--restart" in message
    assert api.creates == 1
    again = invoke(job, "--output", out, "--poll-interval-s", 0.05, "--restart")
    assert again.exit_code == 0, again.output
    assert api.creates == 2

"""The pipeline against an in-memory batch API: rounds, retries of the missing ids only, dead letters, resume after a
kill at any step, and the files and summary it ends with."""

import json

import pytest

from llmq_cli.batchrun.jobfile import read_job, upload_line
from llmq_cli.batchrun.manifest import Manifest
from llmq_cli.batchrun.outcomes import schema_validator
from llmq_cli.batchrun.pipeline import Pipeline, RunConfig
from llmq_cli.batchrun.report import Prices, conclude
from llmq_cli.batchrun.shard import ShardLimits
from tests.unit.batchrun.fakes import FakeBatchApi, ended, failed, ok

CONFIG = RunConfig(window="24h", max_rounds=2, limits=ShardLimits(4, 10**6), max_active_shards=8, poll_interval_s=1)


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.jsonl"
    lines = [
        {"custom_id": f"id-{i}", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return read_job(path)


def run(api, job, tmp_path, config=CONFIG, **kwargs):
    manifest = Manifest(tmp_path / "state" / "manifest.sqlite")
    sleeps = []
    Pipeline(api, manifest, job, config, clock=lambda: 1000.0, sleep=sleeps.append, **kwargs).run()
    return manifest


def finish(job, manifest, tmp_path, max_rounds=2):
    out, dead = tmp_path / "out.jsonl", tmp_path / "out.dead-letter.jsonl"
    _, report = conclude(
        job,
        manifest,
        out,
        max_rounds=max_rounds,
        window_s=86400,
        prices=Prices(2.0, 10.0, 0.5),
        started_s=0,
        now_s=60,
        deadline_s=86400 * 3,
    )
    return (
        [json.loads(x) for x in out.read_text().splitlines()],
        [json.loads(x) for x in dead.read_text().splitlines()],
        report,
    )


def test_a_clean_job_runs_in_one_round_of_shards_within_the_limits(job, tmp_path):
    api = FakeBatchApi()
    manifest = run(api, job, tmp_path)
    assert [s.requests for s in manifest.shards()] == [4, 4, 2] and api.creates == 3
    out, dead, report = finish(job, manifest, tmp_path)
    assert [line["custom_id"] for line in out] == [f"id-{i}" for i in range(10)] and dead == []
    assert report["accepted"] == 10 and report["rounds_used"] == 1 and report["outcomes"]["succeeded"] == 10
    assert report["tokens"] == {"input": 100, "output": 50, "total": 150}
    assert report["cost"] == {"batch": 0.00035, "standard": 0.0007, "batch_discount": 0.5}
    assert report["time"]["budget_s"] == 2 * 86400 and report["time"]["budget_fits_deadline"] is True


def answers(cid, attempt):
    n = int(cid.split("-")[1])
    if n == 1:
        return failed(400, "invalid_value")  # an invalid request: reported, never retried
    if n in (2, 3) and attempt == 0:
        return ended("batch_expired")
    if n == 4 and attempt == 0:
        return failed(500, "engine_error")
    if n == 5:
        return None  # never returned: retried, then dead-lettered
    if n == 6:
        return ok("not json")  # refused by the schema every time
    return ok('{"ok": true}')


def test_only_ids_without_an_accepted_result_are_retried_in_smaller_shards_then_dead_lettered(job, tmp_path):
    api = FakeBatchApi(answers)
    manifest = run(api, job, tmp_path, validate=schema_validator({"type": "object"}))
    retried = [cid for s in manifest.shards(1) for cid in manifest.shard_ids(s.number)]
    assert sorted(retried) == ["id-2", "id-3", "id-4", "id-5", "id-6"]
    assert max(s.requests for s in manifest.shards(1)) <= 2  # half the first round's 4
    assert api.attempts["id-1"] == 1 and api.attempts["id-5"] == 2  # rounds capped at 2
    out, dead, report = finish(job, manifest, tmp_path)
    assert {d["custom_id"]: d["failures"][-1]["code"] for d in dead} == {
        "id-1": "invalid_value",
        "id-5": "missing_result",
        "id-6": "invalid_json",
    }
    assert [d["line"] for d in dead] == [2, 6, 7]
    assert [line["custom_id"] for line in out] == [f"id-{i}" for i in range(10)]
    assert sum(line["response"] is None for line in out) == len(dead) == report["dead_lettered"] == 3
    assert report["accepted"] == 7 and report["rounds_used"] == 2
    assert report["outcomes_by_round"][0] == {"round": 0, "succeeded": 4, "errored": 4, "canceled": 0, "expired": 2}
    assert report["dead_letter_reasons"] == {"invalid_value": 1, "missing_result": 1, "invalid_json": 1}


def test_a_rerun_of_a_finished_job_calls_nothing(job, tmp_path):
    api = FakeBatchApi(answers)
    run(api, job, tmp_path)
    creates, downloads, uploads = api.creates, sum(api.downloads.values()), len(api.files)
    run(api, job, tmp_path)
    assert (api.creates, sum(api.downloads.values()), len(api.files)) == (creates, downloads, uploads)


def test_a_kill_after_a_create_got_through_resumes_without_a_second_create(job, tmp_path):
    api = FakeBatchApi()
    api.fail_next_create_after_sending = True
    with pytest.raises(KeyboardInterrupt):
        run(api, job, tmp_path)
    assert api.creates == 1
    manifest = run(api, job, tmp_path)
    assert api.creates == 3 == len(api.batches)  # the first shard's batch was found by its metadata
    assert sorted(s.batch_id for s in manifest.shards()) == ["batch-0", "batch-1", "batch-2"]
    assert all(count == 1 for count in api.downloads.values())


class Killer:
    """Makes the API's n-th call raise KeyboardInterrupt: before that call reached the target, or (``landed``) once
    it did and its answer was lost."""

    def __init__(self, api: FakeBatchApi, kill_at: int, landed: bool) -> None:
        self.calls, self.kill_at, self.landed = 0, kill_at, landed
        for name in ("upload", "find_upload", "create", "find", "retrieve", "content", "delete"):
            setattr(api, name, self._wrap(getattr(api, name)))

    def _wrap(self, method):
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls != self.kill_at:
                return method(*args, **kwargs)
            if self.landed:
                method(*args, **kwargs)
            raise KeyboardInterrupt

        return call


@pytest.mark.parametrize("landed", [False, True], ids=["before-the-call", "after-the-call-landed"])
def test_a_kill_at_every_step_still_ends_with_one_batch_and_no_upload_per_shard(job, tmp_path, landed):
    """Kill the run at its n-th call to the API, rerun, for every n: each shard gets exactly one batch and one
    upload, every id one accepted result, no upload is left on the target, and no shard collected before the kill is
    downloaded again."""
    for kill_at in range(1, 40):
        state = tmp_path / f"k{kill_at}"
        api = FakeBatchApi()
        killer = Killer(api, kill_at, landed)
        try:
            run(api, job, state)
        except KeyboardInterrupt:
            killed = Manifest(state / "state" / "manifest.sqlite")
            collected = {s.batch_id for s in killed.shards() if s.status == "collected"}
            before = dict(api.downloads)
            manifest = run(api, job, state)
        else:
            assert killer.calls < kill_at
            break
        assert len(api.batches) == len(manifest.shards()) == 3
        assert api.uploaded == 3  # an upload whose answer the kill lost is found, not made again
        assert manifest.accepted_count() == 10
        assert api.uploads() == {}  # a kill between a collect and its delete: the rerun deletes it
        assert all(api.downloads[f] == before[f] for f in before if f.rsplit("-", 1)[0] in collected)
    else:
        pytest.fail("a run with no kill was never reached")


def test_at_most_max_active_shards_run_at_once(job, tmp_path):
    api = FakeBatchApi()
    open_batches, most = set(), 0
    create, retrieve = api.create, api.retrieve

    def tracked_create(*args):
        nonlocal most
        state = create(*args)
        open_batches.add(state.id)
        most = max(most, len(open_batches))
        return state

    def tracked_retrieve(batch_id):
        open_batches.discard(batch_id)
        return retrieve(batch_id)

    api.create, api.retrieve = tracked_create, tracked_retrieve
    run(api, job, tmp_path, config=RunConfig(limits=ShardLimits(2, 10**6), max_active_shards=2))
    assert api.creates == 5 and most == 2


def test_a_line_over_the_targets_line_limit_is_never_uploaded_and_fails_alone(tmp_path):
    path = tmp_path / "job.jsonl"
    lines = [
        {
            "custom_id": f"id-{i}",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "prompt": "x" * (500 * (i == 3))},
        }
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = read_job(path)
    size = len(upload_line(lines[3], "id-3")) - 1
    api = FakeBatchApi()
    config = RunConfig(max_rounds=3, limits=ShardLimits(4, 10**6, max_line_bytes=size - 1), poll_interval_s=1)
    manifest = run(api, job, tmp_path, config=config)
    assert not any(b'"id-3"' in data for data in api.upload_log) and api.attempts["id-3"] == 0
    assert [s.requests for s in manifest.shards()] == [4, 1]  # the other five, in round 0 only
    out, dead, report = finish(job, manifest, tmp_path, max_rounds=3)
    [failure] = dead[0]["failures"]
    assert (dead[0]["custom_id"], failure["code"], failure["retryable"]) == ("id-3", "line_too_large", False)
    assert failure["message"] == f"the line is {size} bytes; the target takes at most {size - 1} bytes per line"
    assert out[3] == {"custom_id": "id-3", "response": None, "error": {**failure_error(failure), "dead_letter": True}}
    assert (report["accepted"], report["dead_letter_reasons"], report["rounds_used"]) == (5, {"line_too_large": 1}, 1)


def failure_error(failure: dict) -> dict:
    return {"code": failure["code"], "message": failure["message"]}


def test_each_collected_shards_upload_is_deleted_and_one_the_target_refused_is_deleted_by_the_next_run(job, tmp_path):
    api = FakeBatchApi()
    api.refuse_deletes = True
    manifest = run(api, job, tmp_path)
    assert len(api.uploads()) == 3 and finish(job, manifest, tmp_path)[2]["uploads_left"] == 3
    api.refuse_deletes = False
    manifest = run(api, job, tmp_path)
    assert api.uploads() == {} and sorted(api.deleted) == ["file-1", "file-2", "file-3"]
    assert finish(job, manifest, tmp_path)[2]["uploads_left"] == 0
    run(api, job, tmp_path)
    assert len(api.deleted) == 3  # each deleted once


def test_the_manifest_and_the_output_files_are_private(job, tmp_path):
    manifest = run(FakeBatchApi(), job, tmp_path)
    finish(job, manifest, tmp_path)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (manifest.path.parent, manifest.path)}
    modes |= {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("out*.jsonl")}
    assert modes == {"state": 0o700, "manifest.sqlite": 0o600, "out.jsonl": 0o600, "out.dead-letter.jsonl": 0o600}

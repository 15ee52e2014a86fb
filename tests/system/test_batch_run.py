"""``llmq batch run`` end to end (issue 20 item 8): a 5,000-line llmq-sim job against a private stack whose batches take
at most 1,000 lines, with --json-schema and a window too short for the first round. The CLI runs as a process; it is
SIGKILLed once its first shard is submitted (seen in its manifest) and run again, which resumes.

What is deterministic: llmq-sim answers a chat line with its user message's bytes, cycled to max_tokens, so a JSON
message with max_tokens = its length comes back as that JSON, and a longer max_tokens makes invalid JSON. The stack's
two workers run at most 2 x 48 deferred lines per 200 ms batch (a quarter of 64 slots is reserved), 480 lines/s. The
rerun creates the shards the kill left (at least five, 4,750 lines) within about 2 s, so with 6 s windows at most
480 x 8 = 3,840 of them can finish: part of round 0 expires whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import openai
import pytest

from llmq_cli.batchrun.api import OpenAIBatchApi
from tests import ports
from tests.stacks import private_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE = ports.block()
API_PORTS = (BASE, BASE + 1)  # metrics: result-router +10, batcher +11, workers +12, +13
LINES = 5000
MAX_ROUNDS = 3
SCHEMA = {
    "type": "object",
    "properties": {"doc": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["doc", "ok"],
}


def job_line(i: int) -> dict:
    """Every 100th line names a model that does not exist (an invalid request); of every 50, one answer is cut JSON
    and one has the wrong type for ``ok``; the rest answer JSON that matches the schema."""
    message = json.dumps({"doc": i, "ok": "yes" if i % 50 == 6 else True})
    max_tokens = len(message) + (4 if i % 50 == 3 else 0)
    body = {"model": "llmq-nope" if i % 100 == 7 else "llmq-sim", "max_tokens": max_tokens}
    body["messages"] = [{"role": "user", "content": message}]
    return {"doc_id": f"doc{i:05d}", "prompt": "p1", "url": "/v1/chat/completions", "body": body}


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    env = {
        "LLMQ_BATCH_MAX_LINES": "1000",
        "LLMQ_FILES_URL": str(tmp_path_factory.mktemp("batch-run-files")),
        "LLMQ_BATCH_END_GRACE_MS": "1000",
    }
    with private_stack(
        infra, api_ports=API_PORTS, tiny_workers=0, sim_workers=2, sim_batch_time_ms=200, extra_env=env
    ) as running:
        yield running


def cli(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "llmq_cli.main", "batch", "run", str(tmp_path / "job.jsonl"),
        "--output", str(tmp_path / "out.jsonl"),
        "--base-url", f"http://127.0.0.1:{API_PORTS[0]}/v1",
        "--api-key", "llmq-dev-key",
        "--id-template", "{doc_id}-{prompt}",
        "--json-schema", str(tmp_path / "schema.json"),
        "--window", "6s",
        "--max-rounds", str(MAX_ROUNDS),
        "--poll-interval-s", "0.5",
        "--price-input-per-m", "1", "--price-output-per-m", "5",
        "--deadline", "1h",
        *extra,
    ]  # fmt: skip


def wait_for_first_submit(process: subprocess.Popen, manifest: Path, deadline_s: float) -> None:
    while time.monotonic() < deadline_s:
        assert process.poll() is None, process.stderr.read()
        if manifest.exists():
            with sqlite3.connect(f"file:{manifest}?mode=ro", uri=True) as db:
                try:
                    if db.execute("SELECT COUNT(*) FROM shards WHERE batch_id IS NOT NULL").fetchone()[0]:
                        return
                except sqlite3.OperationalError:  # the tables are not there yet
                    pass
        time.sleep(0.02)
    pytest.fail("no shard was submitted in time")


def test_a_job_of_five_batches_runs_resumes_after_a_kill_and_ends_with_one_outcome_per_id(stack, tmp_path):
    (tmp_path / "job.jsonl").write_text("".join(json.dumps(job_line(i)) + "\n" for i in range(LINES)))
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    manifest_path = tmp_path / "out.jsonl.state" / "manifest.sqlite"
    env = {**os.environ, "COLUMNS": "200"}
    first = subprocess.Popen(cli(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_first_submit(first, manifest_path, time.monotonic() + 60)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with sqlite3.connect(manifest_path) as db:
        before = dict(db.execute("SELECT number, batch_id FROM shards WHERE batch_id IS NOT NULL"))
    rerun = subprocess.run(cli(tmp_path, "--json"), env=env, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 1, rerun.stderr  # 1: some ids are dead letters (as this job means them to be)
    report = json.loads(rerun.stdout)

    db = sqlite3.connect(manifest_path)
    shards = {
        number: (round_, batch_id)
        for number, round_, batch_id in db.execute("SELECT number, round, batch_id FROM shards")
    }
    ids_of = {}
    for shard, custom_id in db.execute("SELECT shard, custom_id FROM shard_ids"):
        ids_of.setdefault(shard, set()).add(custom_id)
    tag = db.execute("SELECT value FROM job WHERE key = 'tag'").fetchone()[0]

    # No shard was submitted twice: the target holds exactly one batch per shard, and the rerun kept the first ids.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{API_PORTS[0]}/v1", api_key="llmq-dev-key")
    batches = [b for b in client.batches.list(limit=100) if (b.metadata or {}).get("llmq_batch_run") == tag]
    assert sorted(b.id for b in batches) == sorted(batch_id for _, batch_id in shards.values())
    assert all(shards[number][1] == batch_id for number, batch_id in before.items())
    round0 = [n for n, (r, _) in shards.items() if r == 0]
    assert len(round0) == 6 and max(len(ids_of[n]) for n in round0) == 950  # 1,000 less the 5% margin
    assert all(b.request_counts.total <= 1000 for b in batches)

    # Each collected shard's upload is gone from the target (it would hold the tenant's storage quota); the answers
    # are private.
    assert [f.filename for f in client.files.list() if f.filename.startswith(f"{tag}-shard-")] == []
    assert report["uploads_left"] == 0
    private = [manifest_path, tmp_path / "out.jsonl", tmp_path / "out.dead-letter.jsonl"]
    assert [p.stat().st_mode & 0o777 for p in (manifest_path.parent, *private)] == [0o700, 0o600, 0o600, 0o600]

    # Every custom_id ends with exactly one accepted result or one dead-letter entry; the output keeps the job order.
    ids = [f"doc{i:05d}-p1" for i in range(LINES)]
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    dead = [json.loads(line) for line in (tmp_path / "out.dead-letter.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in out] == ids
    accepted = {line["custom_id"]: line for line in out if line["response"] is not None}
    dead_ids = {d["custom_id"] for d in dead}
    assert not accepted.keys() & dead_ids and accepted.keys() | dead_ids == set(ids)
    for line in accepted.values():
        jsonschema.validate(json.loads(line["response"]["body"]["choices"][0]["message"]["content"]), SCHEMA)

    # Invalid requests are reported, not retried; bad answers never count as accepted.
    by_id = {d["custom_id"]: d for d in dead}
    for i in range(7, LINES, 100):
        assert [f["code"] for f in by_id[ids[i]]["failures"]] == ["model_not_found"]
        assert by_id[ids[i]]["line"] == i + 1
    assert all(ids[i] in dead_ids for i in range(LINES) if i % 50 in (3, 6))
    assert {"invalid_json", "schema_mismatch"} <= {f["code"] for d in dead for f in d["failures"]}

    # The short window expired part of round 0; the retries held only ids still missing, in smaller shards.
    assert report["outcomes_by_round"][0]["expired"] > 0 and report["rounds_used"] >= 2
    accepted_round = dict(db.execute("SELECT custom_id, round FROM results"))
    for number, (round_, _) in shards.items():
        if round_ > 0:
            assert len(ids_of[number]) <= 950 >> round_
            assert all(accepted_round.get(cid, round_) >= round_ for cid in ids_of[number])
            assert not any(cid in ids_of[number] for cid in (ids[i] for i in range(7, LINES, 100)))

    # The summary's counts match the files and the manifest.
    assert report["accepted"] == len(accepted) and report["dead_lettered"] == len(dead) == LINES - len(accepted)
    for row in report["outcomes_by_round"]:
        in_round = sum(len(ids_of[n]) for n, (r, _) in shards.items() if r == row["round"])
        assert sum(row[k] for k in ("succeeded", "errored", "canceled", "expired")) == in_round
    assert report["tokens"]["output"] > 0 and report["cost"]["batch"] == pytest.approx(report["cost"]["standard"] / 2)
    assert report["time"]["budget_s"] == MAX_ROUNDS * 6 and report["time"]["budget_fits_deadline"] is True
    print(
        json.dumps({k: report[k] for k in ("accepted", "dead_lettered", "outcomes_by_round", "rounds_used", "shards")})
    )


def test_an_upload_whose_answer_was_lost_is_found_on_the_target_by_its_name_and_size(stack):
    """What a rerun does for a shard left ``uploading``, against llmq's ``GET /v1/files``."""
    api = OpenAIBatchApi(f"http://127.0.0.1:{API_PORTS[0]}/v1", "llmq-dev-key")
    name, data = "lost-answer-shard-0.jsonl", b'{"custom_id": "a"}\n'
    file_id = api.upload(name, data)
    try:
        assert api.find_upload(name, len(data)) == file_id
        assert api.find_upload(name, len(data) + 1) is None  # another shard's plan: not this upload
        assert api.find_upload("lost-answer-shard-1.jsonl", len(data)) is None
    finally:
        assert api.delete(file_id)
    assert api.find_upload(name, len(data)) is None

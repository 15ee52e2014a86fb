"""The batch-job log's pure parts: topic names (own and mirrored), how a snapshot folds the records of the four
topics, which claims count and which one wins, and a job's counters as its results give them."""

import msgspec
import pytest
from pydantic import ValidationError

from llmq_core import ids, wire
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, RECORD_HEADROOM_BYTES
from llmq_core.settings import Settings
from llmq_jobs import jobs
from llmq_jobs.joblog import JobSnapshot, JobTopics, line_key, mirrored_regions, owners_topics, split_line_key
from llmq_jobs.jobs import JobOwner, JobRecord
from tests.builders import job_spec

_json = msgspec.json.encode


def result(custom_id: str, outcome=wire.Outcome.SUCCEEDED, **fields) -> wire.FinalResult:
    fields.setdefault("request_id", f"batch_x:{custom_id}")
    return wire.FinalResult(
        outcome=outcome, model="llmq-sim", reply_to=wire.JobReply(batch_id="batch_x", custom_id=custom_id), **fields
    )


def test_own_topics_and_a_peers_as_mirrormaker_2_names_them():
    assert JobTopics().all() == ("llmq.jobs.specs", "llmq.jobs.lines", "llmq.jobs.ledger", "llmq.jobs.owners")
    assert JobTopics.mirrored("a").topic("ledger") == "a.llmq.jobs.ledger"
    topics = {"llmq.jobs.owners", "a.llmq.jobs.owners", "b.llmq.jobs.owners", "a.llmq.jobs.ledger", "llmq.results"}
    assert owners_topics(topics, "c", ("a", "b")) == {
        "a.llmq.jobs.owners": "a",
        "b.llmq.jobs.owners": "b",
        "llmq.jobs.owners": "c",
    }
    assert mirrored_regions(topics, ("a", "b", "d")) == ["a", "b"]


def test_only_the_configured_peers_owners_topics_are_followed():
    """Issue 34, item 2: a region mirrored here but not configured as a peer (LLMQ_REGION_PEERS) makes no claims."""
    topics = {"llmq.jobs.owners", "a.llmq.jobs.owners", "zzz.llmq.jobs.owners"}
    assert owners_topics(topics, "c", ("a",)) == {"a.llmq.jobs.owners": "a", "llmq.jobs.owners": "c"}
    assert mirrored_regions(topics, ("a",)) == ["a"]
    assert owners_topics(topics, "c", ()) == {"llmq.jobs.owners": "c"}


def test_a_line_key_splits_back_into_batch_and_custom_id():
    assert split_line_key(line_key("batch_a-1f", "claim-1")) == ("batch_a-1f", "claim-1")


def test_a_higher_epoch_wins_and_equal_epochs_go_to_the_greater_region():
    a0, b1, c1 = (JobOwner(batch_id="x", region=r, epoch=e) for r, e in (("a", 0), ("b", 1), ("c", 1)))
    assert jobs.outranks(a0, None)
    assert jobs.outranks(b1, a0) and not jobs.outranks(a0, b1)
    assert jobs.outranks(c1, b1) and not jobs.outranks(b1, c1)
    assert not jobs.outranks(b1, b1)
    assert jobs.highest(None, a0, c1, b1) == c1 and jobs.highest(None, None) is None


def test_a_snapshot_keeps_each_jobs_latest_record_highest_claim_lines_in_order_and_results():
    snapshot = JobSnapshot(region="b")
    spec = job_spec()
    snapshot.apply("specs", b"batch_x", _json(JobRecord(spec=spec, status=jobs.IN_PROGRESS)))
    snapshot.apply("specs", b"batch_x", _json(JobRecord(spec=spec, status=jobs.COMPLETED)))
    for claim in (JobOwner(batch_id="batch_x", region="b", epoch=1), JobOwner(batch_id="batch_x", region="b")):
        snapshot.apply("owners", b"batch_x", _json(claim))
    for custom_id in ("c2", "c1", "c3"):
        snapshot.apply("lines", line_key("batch_x", custom_id), custom_id.encode())
    snapshot.apply("lines", line_key("batch_x", "c3"), None)  # a tombstone forgets
    snapshot.apply("ledger", line_key("batch_x", "c1"), wire.encode(result("c1")))
    assert snapshot.records["batch_x"].status == jobs.COMPLETED
    assert (snapshot.owners["batch_x"].region, snapshot.owners["batch_x"].epoch) == ("b", 1)
    assert list(snapshot.lines["batch_x"].items()) == [("c2", b"c2"), ("c1", b"c1")]
    assert snapshot.results["batch_x"] == {"c1": result("c1")}


def test_a_claim_counts_only_for_the_region_whose_topics_hold_it_and_a_job_is_its_creators_at_epoch_0():
    """Issue 34, item 2: one record {"region": "zzz", "epoch": 7} on an owners topic froze another tenant's job; a claim
    naming any region but the one whose topic holds it is not that region's to make, so it is dropped. A create
    writes no claim: the job's id names the region that created it (epoch 0)."""
    created_in_a = ids.batch_job_id("a")
    assert jobs.creation_claim(created_in_a) == JobOwner(batch_id=created_in_a, region="a")
    assert jobs.creation_claim("batch_x") is None
    spec = job_spec(created_in_a)
    own = JobSnapshot(region="a")
    own.apply("specs", created_in_a.encode(), _json(JobRecord(spec=spec, status=jobs.IN_PROGRESS)))
    assert own.owners[created_in_a] == JobOwner(batch_id=created_in_a, region="a")
    for forged in ("zzz", "b"):
        own.apply("owners", created_in_a.encode(), _json(JobOwner(batch_id=created_in_a, region=forged, epoch=7)))
    assert own.owners[created_in_a] == JobOwner(batch_id=created_in_a, region="a")
    peer = JobSnapshot(region="b")  # a's job copied into b's topics by a takeover: b's claim, never a's creation
    peer.apply("specs", created_in_a.encode(), _json(JobRecord(spec=spec, status=jobs.IN_PROGRESS)))
    assert created_in_a not in peer.owners
    peer.apply("owners", created_in_a.encode(), _json(JobOwner(batch_id=created_in_a, region="b", epoch=1)))
    assert peer.owners[created_in_a].epoch == 1


def test_a_line_refused_at_create_is_settled_from_its_lines_record_and_a_ledger_record_wins():
    """Issue 34, item 2: an API pod writes no ledger record; the result of a line it refused travels on the lines
    topic (JSON FinalResult) and reads back as a settled result, not as a line to run."""
    refused = result("bad", wire.Outcome.ERRORED, error=wire.ErrorInfo(type="invalid_request_error", message="no"))
    snapshot = JobSnapshot(region="a")
    snapshot.apply("lines", line_key("batch_x", "ok"), b'{"type":"generation_request"}')
    snapshot.apply("lines", line_key("batch_x", "bad"), wire.encode(refused, "application/json"))
    assert list(snapshot.lines["batch_x"]) == ["ok"] and snapshot.results["batch_x"] == {"bad": refused}
    snapshot.apply("ledger", line_key("batch_x", "bad"), wire.encode(result("bad")))
    snapshot.apply("lines", line_key("batch_x", "bad"), wire.encode(refused, "application/json"))
    assert snapshot.results["batch_x"] == {"bad": result("bad")}


def test_counters_from_results_count_outcomes_tokens_and_dead_letters():
    retryable = wire.ErrorInfo(type="engine_error", message="lost", retryable=True)
    counts = jobs.result_counts(
        [
            result("a", usage=wire.Usage.of(3, 5)),
            result("b", usage=wire.Usage.of(2, 1)),
            result("c", wire.Outcome.ERRORED, error=retryable),
            result("d", wire.Outcome.ERRORED, error=wire.ErrorInfo(type="invalid_request_error", message="no")),
            result("e", wire.Outcome.EXPIRED),
        ]
    )
    assert counts == {
        "succeeded": 2,
        "input_tokens": 5,
        "output_tokens": 6,
        "errored": 2,
        "dead_letters": 1,
        "expired": 1,
    }


def test_a_results_round_is_read_from_its_request_id_and_counts_as_retries():
    assert [jobs.line_round(result("a", request_id=f"batch_x:a{suffix}")) for suffix in ("", ":1", ":12")] == [0, 1, 12]
    assert jobs.line_round(result("a", request_id="batch_x:a:x")) == 0  # no run of the line llmq names so
    retryable = wire.ErrorInfo(type="engine_error", message="lost", retryable=True)
    counts = jobs.result_counts(
        [
            result("a", request_id="batch_x:a:1", usage=wire.Usage.of(3, 5)),
            result("b", wire.Outcome.ERRORED, request_id="batch_x:b:3", error=retryable),
            result("c", wire.Outcome.CANCELED, request_id="batch_x:c:2"),
        ]
    )
    assert counts == {
        "succeeded": 1,
        "errored": 1,
        "canceled": 1,
        "retried": 6,
        "dead_letters": 1,
        "input_tokens": 3,
        "output_tokens": 5,
    }


@pytest.mark.parametrize(
    ("status", "until"),
    [
        (jobs.COMPLETED, 1_100),
        (jobs.CANCELLED, 1_100),
        (jobs.EXPIRED, 1_100),
        (jobs.FAILED, None),
        (jobs.IN_PROGRESS, None),
    ],
)
def test_a_job_the_driver_ended_is_kept_for_the_retention_after_its_end(status, until):
    record = JobRecord(spec=job_spec(), status=status, times={jobs.IN_PROGRESS: 10, status: 1_000})
    assert jobs.retained_until(record, retention_s=100) == until


def test_a_jobs_output_and_error_files_are_rendered_from_its_results():
    spec = job_spec(results_path="jobs/batch_x/results.jsonl")
    output, error = jobs.output_files(spec, created_at=10, expires_at=20)
    assert (output.id, output.kind, error.id, error.kind) == ("file-o", "output", "file-e", "error")
    assert output.path == error.path == spec.results_path and output.batch_id == "batch_x"


def test_a_batch_line_limit_no_record_of_the_job_log_could_carry_is_refused_at_start():
    most = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES
    assert Settings(jobs={"batch_max_line_bytes": most}).jobs.batch_max_line_bytes == most
    with pytest.raises(ValidationError, match="batch_max_line_bytes"):
        Settings(jobs={"batch_max_line_bytes": most + 1})

"""The names other processes (and older releases of llmq) read: Redis keys byte for byte, the status vocabulary."""

import hashlib

import pytest

from llmq_core import constants, wire
from llmq_core.names import Names
from llmq_core.status import ErrorCode, ErrorType, Outcome, OutcomeLabel, outcome_label

DIGEST = hashlib.sha256(b"t1\0k").hexdigest()

KEYS = [
    (constants.replies_channel("api-0"), "llmq:replies:api-0"),
    (constants.result_key("r1"), "llmq:results:r1"),
    (constants.result_index_key("t1"), "llmq:result-index:t1"),
    (constants.result_bytes_key("t1"), "llmq:result-bytes:t1"),
    (constants.delivered_key("r1"), "llmq:delivered:r1"),
    (constants.copy_delivered_key("r1", "t/0@5"), "llmq:delivered:r1\nt/0@5"),
    (constants.request_copy_key("r1"), "llmq:request-copy:r1"),
    (constants.streamed_key("r1"), "llmq:streamed:r1"),
    (constants.pod_key("api-0"), "llmq:pods:api-0"),
    (constants.alive_key("worker", "w0"), "llmq:alive:worker:w0"),
    (constants.ratelimit_key("t1", "tokens"), "llmq:ratelimit:t1:tokens"),
    (constants.idempotency_key("t1", "k"), f"llmq:idempotency:{DIGEST}"),
    (constants.file_key("file-1"), "llmq:files:file-1"),
    (constants.tenant_files_key("t1"), "llmq:files:tenant:t1"),
    (constants.tenant_storage_key("t1"), "llmq:files:tenant:t1:bytes"),
    (constants.tenant_result_bytes_key("t1"), "llmq:jobs:tenant:t1:result-bytes"),
    (constants.tenant_jobs_key("t1"), "llmq:jobs:tenant:t1"),
    (constants.job_key("b1"), "llmq:jobs:b1"),
    (constants.job_lines_key("b1"), "llmq:jobs:b1:lines"),
    (constants.job_offsets_key("b1"), "llmq:jobs:b1:offsets"),
    (constants.job_results_key("b1"), "llmq:jobs:b1:results"),
    (constants.job_retries_key("b1"), "llmq:jobs:b1:retries"),
    (constants.job_lease_key("b1"), "llmq:jobs:b1:lease"),
    (constants.batch_idempotency_key("t1", "k"), f"llmq:jobs:idempotency:{DIGEST}"),
    (Names().capacity_keys("w0")[0], "llmq:capacity:w0"),
    (Names().capacity_keys("w0")[1], "llmq:capacity:w0:grants"),
]


@pytest.mark.parametrize(("built", "expected"), KEYS, ids=[expected for _, expected in KEYS])
def test_redis_keys_are_the_strings_running_stacks_hold(built, expected):
    assert built == expected


def test_job_keys_are_fixed_names():
    assert (constants.ACTIVE_JOBS_KEY, constants.FILE_EXPIRY_KEY, constants.JOB_EXPIRY_KEY) == (
        "llmq:jobs:active",
        "llmq:files:expiry",
        "llmq:jobs:expiry",
    )


def test_wire_spells_traffic_classes_and_tiers_as_the_constants_do():
    assert wire.TrafficClass.__args__ == constants.TRAFFIC_CLASSES == ("interactive", "near_interactive", "deferred")
    assert wire.Tier.__args__ == constants.TIERS == ("paid", "free")
    assert constants.PRIORITY_CLASSES == ("interactive:paid", "interactive:free", "near_interactive", "deferred")


def test_wire_outcome_is_the_status_outcome():
    assert wire.Outcome is Outcome
    assert [o.value for o in Outcome] == ["succeeded", "errored", "canceled", "expired"]


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_is_its_own_metric_label(outcome):
    assert outcome_label(outcome) == outcome.value
    assert outcome_label(outcome, ErrorType.ENGINE) == outcome.value


def test_the_batchers_full_queue_reads_rejected():
    assert outcome_label(Outcome.ERRORED, ErrorType.OVERLOADED) is OutcomeLabel.REJECTED
    assert outcome_label(Outcome.ERRORED, "overloaded") is OutcomeLabel.REJECTED  # as decoded from the wire


def test_an_error_of_what_the_caller_sent_reads_client_error():
    for error_type in (ErrorType.INVALID_REQUEST, "invalid_request_error", ErrorType.PERMISSION):
        assert outcome_label(Outcome.ERRORED, error_type) is OutcomeLabel.CLIENT_ERROR
    assert outcome_label(Outcome.EXPIRED, ErrorType.INVALID_REQUEST) is OutcomeLabel.EXPIRED
    assert outcome_label(Outcome.ERRORED, ErrorType.SERVER) is OutcomeLabel.ERRORED


def test_error_vocabulary_members_are_the_strings_on_the_wire():
    info = wire.ErrorInfo(type=ErrorType.OVERLOADED, message="m", code=ErrorCode.REQUEST_TOO_LARGE)
    decoded = wire.decode(
        wire.encode(
            wire.FinalResult(
                request_id="r", outcome=Outcome.ERRORED, model="m", reply_to=wire.HttpReply(instance_id="p"), error=info
            )
        )
    )
    assert (decoded.error.type, decoded.error.code) == ("overloaded", "request_too_large")
    assert type(decoded.error.type) is str


def test_a_request_topic_per_traffic_class():
    names = Names()
    assert [names.request_topic(c) for c in constants.TRAFFIC_CLASSES] == list(constants.REQUEST_TOPICS)

"""Batch create bounds what a job's ledger may hold in Redis, and an Idempotency-Key only repeats the same create."""

import json

import pytest

from llmq_api import validation
from llmq_api.batch_jobs.batches import CreateBatch, _repeats
from llmq_api.batch_jobs.builder import (
    LOGPROB_BYTES_PER_ALTERNATIVE,
    LOGPROB_BYTES_PER_TOKEN,
    MAX_LOGPROBS_BYTES,
    MAX_RESULT_BYTES,
    RESULT_BYTES_PER_TOKEN,
    RESULT_ENVELOPE_BYTES,
    line_result_bytes,
)
from tests.builders import job_spec

SPEC = job_spec(input_file_id="file-a", metadata={"k": "v"}, output_file_id="o", error_file_id="e")


def completion(**params) -> validation.ValidRequest:
    return validation.parse_completion(json.dumps({"model": "m", "prompt": "abcd", **params}).encode(), {"m": 0})


def test_a_lines_result_bytes_budget_its_tokens_within_the_workers_cap():
    assert line_result_bytes(completion(max_tokens=10, n=3), 0) == 30 * RESULT_BYTES_PER_TOKEN + RESULT_ENVELOPE_BYTES
    assert line_result_bytes(completion(max_tokens=8190, n=128), 0) == MAX_RESULT_BYTES + RESULT_ENVELOPE_BYTES
    # the context window bounds what a choice may generate
    assert line_result_bytes(completion(max_tokens=1000), 104) == 100 * RESULT_BYTES_PER_TOKEN + RESULT_ENVELOPE_BYTES


def test_a_line_asking_for_logprobs_budgets_their_entries_within_the_workers_cap():
    text = 30 * RESULT_BYTES_PER_TOKEN + RESULT_ENVELOPE_BYTES
    per_token = LOGPROB_BYTES_PER_TOKEN + 5 * LOGPROB_BYTES_PER_ALTERNATIVE
    assert line_result_bytes(completion(max_tokens=10, n=3, logprobs=5), 0) == text + 30 * per_token
    huge = line_result_bytes(completion(max_tokens=8190, n=128, logprobs=5), 0)
    assert huge == MAX_RESULT_BYTES + MAX_LOGPROBS_BYTES + RESULT_ENVELOPE_BYTES


@pytest.mark.parametrize(
    "change, repeats",
    [
        ({}, True),
        ({"input_file_id": "file-b"}, False),
        ({"endpoint": "/v1/chat/completions"}, False),
        ({"completion_window": "48h"}, False),
        ({"metadata": {"k": "other"}}, False),
        ({"metadata": None}, False),
    ],
)
def test_only_the_same_create_repeats_an_idempotency_key(change, repeats):
    fields = {
        "input_file_id": "file-a",
        "endpoint": "/v1/completions",
        "completion_window": "24h",
        "metadata": {"k": "v"},
        **change,
    }
    assert _repeats(CreateBatch(**fields), SPEC) is repeats

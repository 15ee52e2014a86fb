"""The produce-error rule of a batch (llmq_batcher.dispatch.on_produce_error): retry after a growing hold, split one
too large, answer one refused for good. The loop tests (test_loop.py) show each carried out."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordTooLargeError,
)

from llmq_batcher.dispatch import Fail, Retry, Split, on_produce_error
from llmq_batcher.policy import BatchDispatch
from llmq_core.status import ErrorCode, ErrorType
from tests.unit.batcher.helpers import MODEL, T0, req


def batch(size: int) -> BatchDispatch:
    requests = [req(f"r{i}") for i in range(size)]
    return BatchDispatch("t-1", "w1", 1, MODEL, requests, "size", T0)


@pytest.mark.parametrize(
    "exc, failures, delay_ms",
    [
        (KafkaTimeoutError(), 0, 100),  # the first failure in a row
        (KafkaConnectionError(), 1, 200),  # doubles per failure in a row
        (ProducerFenced(), 5, 3200),
        (RuntimeError("anything else"), 6, 5000),  # capped
        (KafkaTimeoutError(), 1000, 5000),
    ],
)
def test_a_transient_failure_retries_after_a_hold_growing_with_the_failures_in_a_row(exc, failures, delay_ms):
    assert on_produce_error(exc, batch(3), failures) == Retry(delay_ms)


@pytest.mark.parametrize("exc", [MessageSizeTooLargeError(), RecordTooLargeError()])
def test_a_batch_too_large_is_split_and_a_lone_request_too_large_is_answered(exc):
    assert on_produce_error(exc, batch(2), 3) == Split()  # a failure in a row before does not matter
    fail = on_produce_error(exc, batch(1), 0)
    assert isinstance(fail, Fail) and (fail.error_type, fail.code) == (
        ErrorType.INVALID_REQUEST,
        ErrorCode.REQUEST_TOO_LARGE,
    )
    assert "does not fit in one record" in fail.message


def test_a_batch_refused_for_good_for_another_reason_is_answered_errored():
    fail = on_produce_error(InvalidTopicError(), batch(3), 0)
    assert isinstance(fail, Fail) and (fail.error_type, fail.code) == (ErrorType.SERVER, ErrorCode.DISPATCH_FAILED)
    assert fail.message.startswith("The batch topic refused the request")

"""An API pod's start (issue 12): settings no Kafka record could carry are refused; the topic check does not keep a
pod from starting while Kafka is down."""

import logging

import pytest
from pydantic import ValidationError

from llmq_api.main import check_topic_limits
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, RECORD_HEADROOM_BYTES
from llmq_core.settings import Settings


def test_a_body_limit_no_record_could_carry_is_refused_at_start():
    most = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES
    assert Settings(api={"max_body_bytes": most}).api.max_body_bytes == most
    with pytest.raises(ValidationError, match="max_body_bytes"):
        Settings(api={"max_body_bytes": most + 1})


@pytest.mark.parametrize("timeout_ms", [0, -5])
def test_a_rate_limit_timeout_that_would_let_everything_through_is_refused_at_start(timeout_ms):
    assert Settings(api={"rate_limit_timeout_ms": 1}).api.rate_limit_timeout_ms == 1
    with pytest.raises(ValidationError, match="rate_limit_timeout_ms"):
        Settings(api={"rate_limit_timeout_ms": timeout_ms})


def test_an_unreachable_broker_is_logged_not_fatal(caplog):
    with caplog.at_level(logging.WARNING):
        check_topic_limits(Settings(kafka={"bootstrap_servers": "127.0.0.1:1"}))  # nothing listens on port 1
    assert "topic limits not checked" in caplog.text

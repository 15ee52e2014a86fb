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
    assert Settings(api_max_body_bytes=most).api_max_body_bytes == most
    with pytest.raises(ValidationError, match="api_max_body_bytes"):
        Settings(api_max_body_bytes=most + 1)


def test_an_unreachable_broker_is_logged_not_fatal(caplog):
    with caplog.at_level(logging.WARNING):
        check_topic_limits(Settings(kafka_bootstrap_servers="127.0.0.1:1"))  # nothing listens on port 1
    assert "topic limits not checked" in caplog.text

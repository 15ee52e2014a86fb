"""``llmq dev create-topic`` refuses names that could never be reply topics, before it reaches any broker."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmq_cli.main import app


@pytest.mark.parametrize("name", ["__consumer_offsets", "llmq.results", "bad name"])
def test_a_name_llmq_refuses_as_a_reply_topic_is_refused(name, monkeypatch):
    monkeypatch.setenv("LLMQ_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens: a create would fail
    result = CliRunner().invoke(app, ["dev", "create-topic", name])
    assert result.exit_code == 2 and "refused" in result.output


def test_configured_prefixes_apply(monkeypatch):
    monkeypatch.setenv("LLMQ_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("LLMQ_KAFKA_REPLY_TOPIC_PREFIXES", "team.")
    result = CliRunner().invoke(app, ["dev", "create-topic", "other.replies"])
    assert result.exit_code == 2 and "allowed prefix" in result.output

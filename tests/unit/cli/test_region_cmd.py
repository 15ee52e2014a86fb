"""``llmq region``'s arguments are checked before anything is read: a typo or this region's own name would otherwise
read as a region with no jobs (``taken_over: 0``) and look like success."""

import pytest
from typer.testing import CliRunner

from llmq_cli.main import app


@pytest.mark.parametrize("command", ["failover", "reruns"])
@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("A", "must be 1-32 characters"),
        ("eu west", "must be 1-32 characters"),
        ("here", "is this region"),
        ("zzz", "is not among this region's peers"),  # issue 34: its claims do not count here
    ],
)
def test_a_from_that_is_not_another_region_is_refused(monkeypatch, command, source, says):
    monkeypatch.setenv("LLMQ_REGION", "here")
    monkeypatch.setenv("LLMQ_REGION_PEERS", "there")
    result = CliRunner().invoke(app, ["region", command, "--from", source])
    assert result.exit_code == 2
    assert says in result.output

"""llmq_jobs.jobs: completion windows, line states and request ids."""

import pytest

from llmq_jobs import jobs

DAY_S = 86_400


@pytest.mark.parametrize("text,seconds", [("24h", 86_400), ("90s", 90), ("10m", 600), ("6h", 21_600), (" 1s ", 1)])
def test_windows_in_seconds_minutes_hours(text, seconds):
    assert jobs.parse_window(text, 7 * DAY_S) == seconds


@pytest.mark.parametrize("text", ["", "24", "h", "0h", "1d", "1.5h", "-1h", "24H", "1h30m", None, 24])
def test_malformed_windows_are_refused(text):
    with pytest.raises(ValueError, match="completion_window"):
        jobs.parse_window(text, 7 * DAY_S)


def test_windows_over_the_maximum_are_refused():
    assert jobs.parse_window("168h", 7 * DAY_S) == 7 * DAY_S
    with pytest.raises(ValueError, match="at most"):
        jobs.parse_window("169h", 7 * DAY_S)


def test_line_states_round_trip():
    assert jobs.parse_state(jobs.pending(0)) == ("p", 0)
    assert jobs.parse_state(jobs.retry(3)) == ("r", 3)
    assert jobs.parse_state(jobs.SUCCEEDED) == ("s", 0)


def test_request_ids_are_stable_per_round_and_new_per_retry_round():
    assert jobs.line_request_id("batch_1", "c-1") == jobs.line_request_id("batch_1", "c-1", 0) == "batch_1:c-1"
    assert jobs.line_request_id("batch_1", "c-1", 2) == "batch_1:c-1:2"
    assert len({jobs.line_request_id("batch_1", "c-1", r) for r in range(4)}) == 4
    assert jobs.output_line_id("batch_1:c-1") == jobs.output_line_id("batch_1:c-1") != jobs.output_line_id("x")

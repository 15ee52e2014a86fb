"""llmq_core.continuation: a lost attempt's progress frames become the next attempt's Continuation (pure)."""

from __future__ import annotations

import msgspec
import pytest

from llmq_core import continuation, wire
from llmq_core.continuation import continued, generated
from tests.unit.worker.worker_fakes import make_request


def frame(attempt: int, index: int, start: int, *ids: int) -> wire.Progress:
    return wire.Progress(attempt=attempt, index=index, start=start, token_ids=list(ids))


def test_the_newest_attempts_frames_make_each_choice_in_order():
    frames = [
        frame(0, 0, 0, 1, 2),
        frame(0, 1, 0, 7),
        frame(0, 0, 2, 3),
        frame(1, 0, 0, 1, 2, 3),  # attempt 1 restates its continuation, then goes on
        frame(0, 0, 3, 99),  # the lost attempt 0, late: left out
        frame(1, 0, 3, 4, 5),
        frame(1, 1, 0, 7, 8),
    ]
    assert generated(frames, 2) == (1, [[1, 2, 3, 4, 5], [7, 8]])


def test_a_gap_cuts_its_choice_before_it_and_an_unknown_choice_is_ignored():
    frames = [frame(0, 0, 0, 1, 2), frame(0, 0, 5, 9), frame(0, 0, 2, 3), frame(0, 4, 0, 5)]
    assert generated(frames, 2) == (0, [[1, 2], []])
    assert generated([], 1) is None


def test_a_redispatched_request_carries_its_tokens_and_counts_its_hops():
    request = make_request("r", "hello", n=2, attempt=1)
    out = continued(request, [frame(0, 0, 0, 5, 6), frame(0, 1, 0, 7)], max_hops=3)
    assert out.continuation == wire.Continuation(token_ids=[[5, 6], [7]], hops=1, from_attempt=0)
    again = continued(msgspec.structs.replace(out, attempt=2), [frame(1, 0, 0, 5, 6, 8)], max_hops=3)
    assert again.continuation == wire.Continuation(token_ids=[[5, 6, 8], []], hops=2, from_attempt=1)
    # its produce failed and it goes out again from the same frames: the same seam, not one more
    retried = continued(again, [frame(1, 0, 0, 5, 6, 8)], max_hops=2)
    assert retried.continuation == again.continuation


@pytest.mark.parametrize(
    "changes, max_hops",
    [
        ({}, 0),  # continuation off
        ({"continuation": wire.Continuation(token_ids=[[1]], hops=2)}, 2),  # its hops used up
        ({"structured": wire.Structured(kind="json_object")}, 3),  # a grammar's state does not cross the seam
        ({"sampling": wire.SamplingParams(logprobs=0)}, 3),  # nor the entries of the tokens before it
    ],
)
def test_what_cannot_continue_runs_from_its_start_without_a_stale_continuation(changes, max_hops):
    request = msgspec.structs.replace(make_request("r", attempt=3), **changes)
    assert continued(request, [frame(2, 0, 0, 4)], max_hops).continuation is None


def test_no_tokens_or_a_record_too_large_runs_from_the_start(monkeypatch):
    request = make_request("r", attempt=1)
    assert continued(request, [], 3).continuation is None
    assert continued(request, [frame(0, 0, 0)], 3).continuation is None
    assert continued(request, [frame(0, 0, 0, *range(100))], 3).continuation is not None
    monkeypatch.setattr(continuation, "MAX_REQUEST_RECORD_BYTES", len(wire.encode(request)) + 50)
    assert continued(request, [frame(0, 0, 0, *range(100))], 3).continuation is None

"""engine.py helpers shared by the engines: the smoothed token rate behind est_drain_ms, logit_bias checks, FinalEvent
building, and the continuous-batching engines' cancel and capacity."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llmq_core.clock import FakeClock
from llmq_core.wire import ErrorInfo, GenerationRequest, Outcome, Usage
from llmq_worker.engine import (
    Capacity,
    ChoiceEnd,
    FinalEvent,
    InvalidRequest,
    SequenceEngine,
    TokenRate,
    check_logit_bias,
)
from tests.unit.worker.worker_fakes import make_request


def test_token_rate_measures_windows_and_smooths_with_its_half_life():
    now = [100.0]
    rate = TokenRate(half_life_s=1.0, window_s=0.5, monotonic=lambda: now[0])
    assert rate.drain_ms(100) == 0  # unmeasured
    now[0] += 0.25
    rate.add(50)
    assert rate.tokens_per_s == 0  # window not over yet
    now[0] += 0.75
    rate.add(50)
    assert rate.tokens_per_s == pytest.approx(100.0)
    assert rate.drain_ms(250) == 2500 and rate.drain_ms(0) == 0
    now[0] += 1.0
    rate.add(300)  # 300 tokens/s over one half-life: halfway from 100 to 300
    assert rate.tokens_per_s == pytest.approx(200.0)


@pytest.mark.parametrize("idle_s", [30.0, 600.0])
def test_token_rate_after_idle_keeps_the_rate_measured_while_busy(idle_s):
    now = [100.0]
    rate = TokenRate(half_life_s=2.0, window_s=0.25, monotonic=lambda: now[0])
    for _ in range(20):  # busy: 200 tokens/s
        now[0] += 0.05
        rate.add(10)
    assert rate.tokens_per_s == pytest.approx(200.0)
    rate.idle()  # nothing left (a heartbeat's capacity() says so), then a burst's first tokens after the idle time
    now[0] += idle_s
    rate.add(16)
    assert rate.tokens_per_s == pytest.approx(200.0)
    for _ in range(10):
        now[0] += 0.05
        rate.add(10)
    assert rate.tokens_per_s == pytest.approx(200.0)
    assert rate.drain_ms(16 * 24) == pytest.approx(1920, abs=1)  # 16 sequences x 24 tokens: under 2 s, not minutes
    now[0] += 2.0  # busy, not idle: a 2 s step (a long prefill) is part of the rate
    rate.add(10)
    assert rate.tokens_per_s < 150  # down from 200: the slow step counts


@pytest.mark.parametrize(
    "bias, ok",
    [
        (None, True),
        ({0: -100.0, 258: 100.0}, True),
        ({259: 1.0}, False),
        ({-1: 1.0}, False),
        ({7: 100.5}, False),
        ({i: 1.0 for i in range(301)}, False),
    ],
)
def test_check_logit_bias(bias, ok):
    request = make_request(logit_bias=bias)
    if ok:
        check_logit_bias(request, 259)
    else:
        with pytest.raises(InvalidRequest, match="logit_bias"):
            check_logit_bias(request, 259)


# --- FinalEvent.build and the continuous-batching engines' shared bookkeeping -----------------------------------------


@dataclass
class FakeJob:
    """An EngineRun with choices given as (text, tokens, finish_reason, done) and ``max_tokens`` per sequence."""

    request: GenerationRequest
    ends: list[tuple[str, int, str | None, bool]]
    prompt_tokens: int = 12
    started_ms: int = 5
    first_token_ms: int = 7
    cached_tokens: int = 4
    max_tokens: int = 10

    def choice_ends(self) -> list[ChoiceEnd]:
        return [ChoiceEnd(i, text, tokens, reason) for i, (text, tokens, reason, _) in enumerate(self.ends)]

    def tokens_left(self) -> list[int]:
        return [self.max_tokens - tokens for _, tokens, _, done in self.ends if not done]


def test_final_event_counts_the_prompt_once_and_every_choice_and_keeps_finish_reasons_only_for_success():
    job = FakeJob(make_request(n=3), [("ab", 5, "stop", True), ("cd", 7, "length", True), ("", 0, None, False)])
    done = FinalEvent.build(job, Outcome.SUCCEEDED, 9)
    assert done.usage == Usage(prompt_tokens=12, completion_tokens=12, total_tokens=24, cached_tokens=4)
    assert [(c.index, c.text, c.finish_reason) for c in done.choices] == [
        (0, "ab", "stop"),
        (1, "cd", "length"),
        (2, "", None),
    ]
    assert (done.request_id, done.started_ms, done.first_token_ms, done.finished_ms) == ("r1", 5, 7, 9)
    error = ErrorInfo(type="engine_error", message="boom")
    failed = FinalEvent.build(job, Outcome.ERRORED, 9, error=error, shared=True)
    assert [c.finish_reason for c in failed.choices] == [None, None, None] and failed.usage == done.usage
    assert failed.error == error and failed.shared_failure and not done.shared_failure


class FakeSequenceEngine(SequenceEngine):
    def __init__(self, max_sequences: int) -> None:
        super().__init__(max_sequences=max_sequences, clock=FakeClock(1_000))
        self.stopped: list[str] = []

    def _stop(self, job: FakeJob) -> None:
        self.stopped.append(job.request.request_id)


def test_sequence_engine_capacity_runs_the_first_max_sequences_live_sequences():
    engine = FakeSequenceEngine(max_sequences=2)
    assert engine.capacity() == Capacity(max_slots=2, running=0, queued=0, est_drain_ms=0)
    engine._jobs["a"] = FakeJob(make_request("a", n=2), [("", 4, None, False), ("", 10, "stop", True)])
    engine._jobs["b"] = FakeJob(make_request("b", n=2), [("", 1, None, False), ("", 0, None, False)])
    engine._rate.tokens_per_s = 10.0
    capacity = engine.capacity()
    assert (capacity.running, capacity.queued, capacity.free_slots) == (2, 1, 0)
    assert capacity.est_drain_ms == 2500  # (6 + 9 + 10) tokens left at 10 tokens/s
    engine._jobs.clear()
    engine._rate.add(1)  # tokens: busy
    assert not engine._rate._idle
    engine.capacity()  # a heartbeat while nothing runs: the idle time stays out of the token rate
    assert engine._rate._idle


async def test_sequence_engine_cancel_stops_the_job_and_ends_it_canceled_once():
    engine = FakeSequenceEngine(max_sequences=2)
    engine._jobs["a"] = FakeJob(make_request("a"), [("so far", 2, "length", False)])
    engine.cancel("a")
    engine.cancel("a")
    engine.cancel("unknown")
    [event] = await engine.next_events()
    assert engine.stopped == ["a"] and not engine._jobs
    assert (event.request_id, event.outcome, event.finished_ms) == ("a", Outcome.CANCELED, 1_000)
    assert [(c.text, c.finish_reason) for c in event.choices] == [("so far", None)]

"""Issue 28 item 5, admission predicts the wait it admits, on a stack in miniature with an injected clock
(tests/unit/api/admission_sim.py: the real merge_reports, ShedPolicy, DrainMeter and BacklogDrain; 1 or 3
batchers): a burst of the fleet's requests/s x the class's limit gets no 429 after 30 s or 10 min idle, a larger burst
admits what drains within the limit, and sustained overload admits nothing that is not served in time. In each case at
least 95% of the admitted requests wait within max(0.5 x measured, 250 ms) of their prediction and at most 1% of a
class waits past its limit."""

import pytest

from llmq_core.constants import PRIORITY_CLASSES
from tests.unit.api.admission_sim import Stack, share_late, share_within

PAID, FREE, NEAR, DEFERRED = PRIORITY_CLASSES
LIMIT_MS = {PAID: 15_000, FREE: 5_000}  # Settings.api.shed_wait_ms' defaults


def sim_fleet(batchers: int) -> Stack:
    """Two llmq-sim workers x 64 per 500 ms: 256 requests/s, 1,280 in interactive:free's 5 s."""
    return Stack(128, 500, workers=2, batchers=batchers)


def assert_predicted(stack: Stack, classes: tuple[str, ...], since_ms: int) -> None:
    served = [s for c in classes for s in stack.of(c, since_ms)]
    assert share_within(served) >= 0.95
    for cls in classes:
        assert share_late(stack.of(cls, since_ms), LIMIT_MS[cls]) <= 0.01


@pytest.mark.parametrize("idle_s", [30, 600])
@pytest.mark.parametrize("batchers", [1, 3])
def test_after_idle_a_burst_of_the_fleets_rate_times_the_limit_is_all_admitted(idle_s, batchers):
    # llmq-tiny: 8 sequences, each about 1 s (8 requests/s); the workers' heartbeats promised about that until their
    # token rate, measured across the idle time, read near 0 (what predicted 69-194 s waits for 120 paid requests).
    burst_ms: list[int] = []
    stack = Stack(
        8, 1000, workers=8, batchers=batchers, capacity_per_s=lambda now: 0.1 if burst_ms and now > burst_ms[0] else 8.0
    )
    stack.burst(PAID, 60)  # a warm-up: 7.5 s of backlog
    stack.drain()
    stack.advance(idle_s * 1000)
    burst_ms.append(stack.clock.now_ms())
    admitted = stack.burst(PAID, 8 * 15, spread_ms=2000)  # 120 = 8/s x 15 s, sent over 2 s
    stack.drain()
    assert admitted == 120 and not stack.refused
    assert_predicted(stack, (PAID,), burst_ms[0])


@pytest.mark.parametrize("idle_s", [30, 600])
@pytest.mark.parametrize("batchers", [1, 3])
@pytest.mark.parametrize("size", [1280, 3000])
def test_a_burst_admits_what_drains_within_the_limit_and_no_429_up_to_it(idle_s, batchers, size):
    stack = sim_fleet(batchers)
    stack.load({FREE: 384}, 8)  # 150% for 8 s: the batchers measure the drain rate
    stack.load({FREE: 40}, 10)  # then light load: each report finds a few requests waiting for the next window
    stack.drain()
    stack.advance(idle_s * 1000)
    start_ms = stack.clock.now_ms()
    admitted = stack.burst(FREE, size)
    stack.drain()
    assert admitted == min(size, 1280)
    assert_predicted(stack, (FREE,), start_ms)


@pytest.mark.parametrize("batchers", [1, 3])
@pytest.mark.parametrize(
    "rates",
    [
        pytest.param({FREE: 384.0}, id="free-at-150%"),
        pytest.param({PAID: 154.0, FREE: 230.0}, id="paid-60%-free-90%"),
    ],
)
def test_sustained_overload_admits_only_what_is_served_within_the_limit(batchers, rates):
    stack = sim_fleet(batchers)
    # the first 20 s: the backlog forms, the batchers measure its drain and paid's share (smoothed over about 5 s)
    stack.load(rates, 20)
    start_ms = stack.clock.now_ms()
    stack.load(rates, 20)
    stack.drain()
    assert_predicted(stack, tuple(rates), start_ms)
    # All the paid traffic fits (60% of the fleet); free gets the rest: 40% of 256/s, not its 90%.
    if PAID in rates:
        assert len(stack.of(PAID, start_ms)) == int(154 * 20)
        assert len(stack.of(FREE, start_ms)) == pytest.approx(0.4 * 256 * 20, rel=0.05)

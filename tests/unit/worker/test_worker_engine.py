"""engine.py helpers shared by the engines: the smoothed token rate behind est_drain_ms, logit_bias checks."""

from __future__ import annotations

import pytest

from llmq_worker.engine import InvalidRequest, TokenRate, check_logit_bias
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

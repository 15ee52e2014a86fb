"""The prefix-hashing cost figure of `llmq bench scale` and bench/prefix_hash.py."""

from __future__ import annotations

import itertools

from llmq_bench import prefix_cost, scale
from llmq_core.constants import PREFIX_BLOCK_BYTES


def test_hash_cost_reports_cpu_per_request_and_blocks():
    ticks = itertools.count(step=0.001)  # each timer read 1 ms of CPU later: each pass costs 1 ms
    prompts = ["x" * (3 * PREFIX_BLOCK_BYTES + 5), "y" * PREFIX_BLOCK_BYTES]
    cost = prefix_cost.hash_cost(prompts, repeats=2, timer=lambda: next(ticks))
    assert cost == {
        "requests": 2,
        "prompt_bytes_mean": (4 * PREFIX_BLOCK_BYTES + 5) / 2,
        "blocks_mean": 2.0,
        "us_per_request": 500.0,
    }
    assert prefix_cost.share_of(cost, 2.0) == 0.25
    assert prefix_cost.share_of(cost, None) is None


def test_scale_result_carries_the_hashing_share_of_each_runs_batcher_cpu(tmp_path):
    runs = [{"feed": "kafka", "row": {"cpu_ms_per_request": {"batcher": 1.0}}}]
    cost = {"requests": 1, "prompt_bytes_mean": 2048.0, "blocks_mean": 16.0, "us_per_request": 20.0}
    out = scale.result(scale.ScaleConfig(batchers=(1,), output=tmp_path / "s.json"), runs, cost)
    assert out["prefix_hash"] == {**cost, "share_of_batcher_cpu": [0.02]}

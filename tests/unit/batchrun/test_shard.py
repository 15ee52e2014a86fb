"""Shards respect the request and byte limits, whichever binds first; limits come from flags or the target."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmq_cli.batchrun.shard import (
    OPENAI_MAX_FILE_BYTES,
    OPENAI_MAX_REQUESTS,
    ShardLimits,
    plan,
    retry_limits,
    shard_limits,
    too_large,
)


def test_the_request_cap_binds_when_lines_are_small():
    sizes = [(f"id{i}", 10) for i in range(25)]
    assert [len(s) for s in plan(sizes, ShardLimits(10, 10_000))] == [10, 10, 5]


def test_the_byte_cap_binds_when_lines_are_large():
    sizes = [(f"id{i}", 400) for i in range(10)]
    assert [len(s) for s in plan(sizes, ShardLimits(100, 1000))] == [2, 2, 2, 2, 2]
    assert [len(s) for s in plan(sizes, ShardLimits(100, 800))] == [2, 2, 2, 2, 2]  # exactly full is allowed


def test_a_line_a_retry_rounds_halved_bytes_cannot_hold_gets_a_shard_of_its_own():
    assert plan([("a", 5), ("big", 2000), ("b", 5)], ShardLimits(10, 1000)) == [["a"], ["big"], ["b"]]


@pytest.mark.parametrize(
    ("size", "limits", "why"),
    [
        (101, ShardLimits(10, 1000, max_line_bytes=100), None),  # 100 bytes and its newline
        (102, ShardLimits(10, 1000, max_line_bytes=100), "the line is 101 bytes; the target takes at most 100"),
        (1000, ShardLimits(10, 1000), None),
        (1001, ShardLimits(10, 1000), "the line is 1001 bytes with its newline; a shard file may hold at most 1000"),
    ],
)
def test_a_line_over_the_targets_line_limit_or_a_shard_file_can_never_be_uploaded(size, limits, why):
    found = too_large(size, limits)
    assert found is None if why is None else found.startswith(why)


@given(st.lists(st.integers(1, 500), max_size=200), st.integers(1, 20), st.integers(500, 3000))
def test_every_shard_fits_and_the_order_is_kept(sizes, max_requests, max_bytes):
    items = [(f"id{i}", size) for i, size in enumerate(sizes)]
    shards = plan(items, ShardLimits(max_requests, max_bytes))
    size_of = dict(items)
    assert [cid for shard in shards for cid in shard] == [cid for cid, _ in items]
    for shard in shards:
        assert 1 <= len(shard) <= max_requests and sum(size_of[c] for c in shard) <= max_bytes


def test_limits_are_the_targets_less_a_margin_unless_flags_say():
    assert shard_limits(ShardLimits(1000, 200_000), None, None) == ShardLimits(950, 190_000)
    assert shard_limits(None, None, None) == ShardLimits(
        int(OPENAI_MAX_REQUESTS * 0.95), int(OPENAI_MAX_FILE_BYTES * 0.95)
    )
    assert shard_limits(ShardLimits(1000, 200_000), 300, 5000) == ShardLimits(300, 5000)
    assert shard_limits(ShardLimits(1000, 200_000, 4096), None, None).max_line_bytes == 4096  # exact: no margin
    assert retry_limits(ShardLimits(900, 1000, 4096), 2).max_line_bytes == 4096


def test_retry_rounds_cut_smaller_shards():
    assert retry_limits(ShardLimits(900, 1000), 0) == ShardLimits(900, 1000)
    assert retry_limits(ShardLimits(900, 1000), 2) == ShardLimits(225, 250)
    assert retry_limits(ShardLimits(1, 1), 5) == ShardLimits(1, 1)

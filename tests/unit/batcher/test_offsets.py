"""The offset tracker: commit only below the oldest record not yet dispatched or answered."""

import pytest

from llmq_batcher.offsets import OffsetTracker


@pytest.mark.parametrize(
    "consumed, settled, expected",
    [
        ([], [], None),
        ([5, 6, 7], [], 5),
        ([5, 6, 7], [5], 6),
        ([5, 6, 7], [6, 7], 5),  # 5 still held: nothing past it may be committed
        ([5, 6, 7], [7, 6, 5], 8),
        ([5, 9, 12], [5, 9], 12),  # gaps (compacted or other records) are fine
        ([5, 9, 12], [5, 9, 12], 13),
    ],
)
def test_committable_is_the_first_unsettled_offset(consumed, settled, expected):
    tracker = OffsetTracker()
    for offset in consumed:
        tracker.track("p0", offset)
    for offset in settled:
        tracker.settle("p0", offset)
    assert tracker.committable("p0") == expected
    assert tracker.unsettled() == len(set(consumed) - set(settled))


def test_partitions_are_independent():
    tracker = OffsetTracker()
    tracker.track("a", 0)
    tracker.track("b", 0)
    tracker.settle("b", 0)
    assert (tracker.committable("a"), tracker.committable("b")) == (0, 1)


def test_commit_positions_report_only_moves_after_a_confirmed_commit():
    tracker = OffsetTracker()
    tracker.track("a", 0)
    tracker.track("a", 1)
    assert tracker.commit_positions() == {}, "consumption began at 0: nothing to commit yet"
    tracker.settle("a", 0)
    assert tracker.commit_positions() == {"a": 1}
    assert tracker.commit_positions() == {"a": 1}, "unconfirmed: offered again"
    tracker.mark_committed({"a": 1})
    assert tracker.commit_positions() == {}
    tracker.settle("a", 1)
    assert tracker.commit_positions() == {"a": 2}


def test_forgotten_partition_ignores_late_settles():
    tracker = OffsetTracker()
    tracker.track("a", 3)
    tracker.forget("a")
    tracker.settle("a", 3)
    assert tracker.committable("a") is None and tracker.commit_positions() == {}

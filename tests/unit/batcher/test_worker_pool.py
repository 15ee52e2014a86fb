"""The worker pool's lazy heap: a stale entry never ranks a worker."""

from llmq_batcher.workers import WorkerPool, WorkerView
from tests.builders import heartbeat


def view(**fields) -> WorkerView:
    hb = heartbeat(**fields)
    worker = WorkerView(hb)
    worker.apply_heartbeat(hb, now_ms=0, taken_after_ms=1000)
    return worker


def test_a_worker_that_left_and_came_back_is_ranked_by_its_new_view_only():
    pool = WorkerPool()
    old = view()  # 8 free slots: its heap entry says so
    pool.add(old)
    pool.remove(old)
    back = view(running=8)  # the same worker back with a fresh view and no room: no heap entry of its own
    pool.add(back)
    assert pool.best(now_ms=0) is None  # the old view's entry must not pass for the new view's


def test_the_worker_with_most_room_ranks_first():
    pool = WorkerPool()
    busy, idle = view(worker_id="busy", running=6), view(worker_id="idle")
    pool.add(busy)
    pool.add(idle)
    assert pool.best(now_ms=0) is idle

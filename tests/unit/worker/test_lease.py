"""A partition lease's holder counts as gone (taken over at once instead of after the lease's ttl) only when it was a
process of this host that no longer runs or is a zombie: a holder elsewhere is never known to be gone."""

import pytest

from llmq_worker.lease import Holder, gone

HOST = "host-a"


@pytest.mark.parametrize(
    ("holder", "stat", "is_gone"),
    [
        (Holder(worker_id="w", pid=42, host=HOST), "42 (python3) S 1 42", False),  # running
        (Holder(worker_id="w", pid=42, host=HOST), "42 (py (x) y) R 1 42", False),  # a ')' in its name
        (Holder(worker_id="w", pid=42, host=HOST), "42 (python3) Z 1 42", True),  # killed, not reaped yet
        (Holder(worker_id="w", pid=43, host=HOST), None, True),  # no such process
        (Holder(worker_id="w", pid=43, host="host-b"), None, False),  # elsewhere: its lease has to lapse
    ],
)
def test_a_holder_is_gone_only_when_it_was_a_process_of_this_host_that_ended(tmp_path, holder, stat, is_gone):
    if stat is not None:
        (tmp_path / str(holder.pid)).mkdir()
        (tmp_path / str(holder.pid) / "stat").write_text(stat)
    assert gone(holder, host=HOST, proc=tmp_path) is is_gone

"""Which processes `llmq dev up` counts as running: a process killed with SIGKILL and still being torn down (its
flags carry PF_EXITING for hundreds of ms when it maps gigabytes, as a worker does) is not, so an ``up`` right after
the kill starts it again, once its exit has completed and freed its ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from llmq_cli import devstack

RUNNING = ("S", 0x400100)
EXITING = ("R", 0x40040C)  # read from /proc right after a kill -9 of a process with 3 GiB resident
ZOMBIE = ("Z", 0x40840C)


@pytest.mark.parametrize(
    ("proc", "ours", "present"),
    [(RUNNING, True, True), (EXITING, False, True), (ZOMBIE, False, False), (None, False, False)],
)
def test_a_process_is_running_unless_gone_a_zombie_or_exiting(monkeypatch, proc, ours, present):
    monkeypatch.setattr(devstack, "_proc", lambda pid, marker: proc)
    assert (devstack._is_ours(1, "m"), devstack._present(1, "m")) == (ours, present)


def test_proc_reads_state_and_flags_of_a_real_process_and_refuses_another_program():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "llmq-marker"])
    try:
        state, flags = devstack._proc(child.pid, "llmq-marker")
        assert state in "RS" and not flags & devstack.PF_EXITING
        assert devstack._proc(child.pid, "another-marker") is None
        assert devstack._is_ours(child.pid, "llmq-marker")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert devstack._proc(child.pid, "llmq-marker") is None

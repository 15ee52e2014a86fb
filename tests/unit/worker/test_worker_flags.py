"""Every worker flag is also a setting of the worker group (LLMQ_WORKER_*); a flag given wins."""

import pytest

from llmq_core.settings import WorkerSettings
from llmq_worker import main

REQUIRED = ["--worker-id", "w", "--partition", "0", "--model", "llmq-sim", "--engine", "simulated"]


def test_every_flag_is_a_worker_setting():
    assert len(main._FLAGS) == 15
    assert {field for field, _ in main._FLAGS.values()} <= set(WorkerSettings.model_fields)


def test_settings_stand_in_for_flags_not_given_and_a_flag_given_wins():
    worker = WorkerSettings(id="w-env", partition=3, model="llmq-sim", engine="simulated", batch_time_ms=7, device="x")
    args = main.parse_args(["--partition", "5", "--device", "cpu"], worker)
    assert (args.worker_id, args.partition, args.model, args.engine) == ("w-env", 5, "llmq-sim", "simulated")
    assert (args.batch_time_ms, args.device, args.max_batch_size) == (7, "cpu", None)


def test_the_environment_sets_the_worker_settings(monkeypatch):
    monkeypatch.setenv("LLMQ_WORKER_MAX_CONCURRENT_SEQUENCES", "12")
    monkeypatch.setenv("LLMQ_WORKER_GPU_MEMORY_UTILIZATION", "0.5")
    args = main.parse_args(REQUIRED)
    assert (args.max_concurrent_sequences, args.gpu_memory_utilization) == (12, 0.5)


def test_the_four_identity_flags_are_required_unless_set(capsys):
    with pytest.raises(SystemExit):
        main.parse_args(REQUIRED[2:], WorkerSettings())
    assert "--worker-id" in capsys.readouterr().err
    assert main.parse_args(REQUIRED[2:], WorkerSettings(id="w")).worker_id == "w"

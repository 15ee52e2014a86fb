"""What an operator reads: ``llmq dev up`` names why a service did not come up (its last logged error), ``llmq dev
status`` says when nothing runs, and tables outside a terminal keep every column instead of rich's 80."""

from __future__ import annotations

import socket
import time

import pytest
from rich.table import Table
from typer.testing import CliRunner

from llmq_cli.console import PIPE_WIDTH, make_console
from llmq_cli.devstack import DevStack, StackConfig, last_error, service_specs
from llmq_cli.main import app

TRACEBACK = """{"level":"INFO","msg":"starting"}
Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: API keys file k.yaml: keys[0] needs a tenant
"""


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        ('{"level":"ERROR","msg":"refusing to start: topic limit"}\n{"level":"INFO","msg":"stopped"}\n', "refusing"),
        (TRACEBACK, "ValueError: API keys file k.yaml: keys[0] needs a tenant"),
        ('{"level":"INFO","msg":"started"}\n', "no error logged (see {path})"),
    ],
    ids=["json-error", "traceback", "nothing"],
)
def test_the_last_error_of_a_log(tmp_path, log, cause):
    path = tmp_path / "svc.log"
    path.write_text(log)
    assert last_error(path).startswith(cause.format(path=path))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_api_pod_refusing_a_bad_keys_file_is_named_with_its_cause(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{tenant: a}]\n")  # no key, no class
    cfg = StackConfig(
        state_dir=tmp_path / "state",
        kafka_port=1,  # nothing listens: the keys file is refused first
        redis_port=1,
        api_ports=(free_port(),),
        tiny_workers=0,
        sim_workers=0,
        manage_infra=False,
        extra_env={"LLMQ_API_KEYS_FILE": str(keys), "LLMQ_METRICS_PORT": "0"},
    )
    stack = DevStack(cfg)
    for folder in (stack.pids, stack.logs):
        folder.mkdir(parents=True)
    [api] = [spec for spec in service_specs(cfg) if spec.kind == "api"]
    stack._spawn(api)  # noqa: SLF001 - one real process, without the broker and Redis that up() waits for
    with pytest.raises(RuntimeError) as info:
        stack._wait_healthy(time.monotonic() + 120)  # noqa: SLF001
    assert f"api-0: API keys file {keys}: keys[0] needs a tenant" in str(info.value)


def test_status_with_nothing_running_says_so(tmp_path):
    result = CliRunner().invoke(app, ["dev", "status", "--state-dir", str(tmp_path), "--redis-port", "1"])
    assert result.exit_code == 0 and "nothing runs" in result.output and "health" not in result.output


def test_a_table_outside_a_terminal_keeps_every_column(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console()
    table = Table(*(f"column-{i}" for i in range(12)))
    table.add_row(*(f"value-{i:04}" for i in range(12)))
    with console.capture() as captured:
        console.print(table)
    assert not console.is_terminal and console.width == PIPE_WIDTH
    assert all(f"value-{i:04}" in captured.get() for i in range(12))

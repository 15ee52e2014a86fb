"""Every runnable example of README.md and docs/**/*.md, verbatim, twice in a row, against a running stack.

Which blocks run is said by tests/doc_examples.py (every ```bash and ```python block without a skip mark). The blocks
of one document run in order in one scratch folder (with a `.venv` link to this checkout's), then all again in the same
folder: the second round meets what the first left (topics, files), as a user who runs an example twice does. Bash
blocks run under `bash -euo pipefail`, so a failing command inside a block fails it too; Python blocks run on this
.venv's interpreter.

Addresses: the examples name the documented ones (API pods 127.0.0.1:8000 and 127.0.0.1:8001, Kafka 127.0.0.1:9092).
This test's stack listens on API_PORTS and uses the suite's Kafka, so each block's text has exactly those three
addresses replaced and nothing else. Commands that read their address from the environment get it there:
LLMQ_KAFKA_BOOTSTRAP_SERVERS and LLMQ_REDIS_URL (the suite's, for `llmq dev create-topic`) and LLMQ_API_URL (for
`llmq batch`). The stack has one llmq-tiny and one llmq-sim worker (200 ms batches), to stay quick: no example depends
on the stack's shape.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmq_cli.devstack import DevStack
from tests import ports
from tests.doc_examples import ROOT, Example, all_examples
from tests.infra import infra_kind
from tests.stacks import private_stack
from tests.system.test_stack_e2e import sim_answer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long(120)]

BASE = ports.block()
API_PORTS = (BASE, BASE + 1)  # metrics: result-router +10, batcher +11, workers +12, +13
BLOCK_TIMEOUT_S = 300  # a hang, not a speed bound: a 300-line batch job on a loaded machine takes minutes
RUNS = [e for e in all_examples() if e.runs]


@dataclass(frozen=True)
class Run:
    """One run of one block: what it printed and when (epoch ms), to tell its own answers from older ones."""

    stdout: str
    started_ms: int
    ended_ms: int
    folder: Path


@pytest.fixture(scope="module")
def stack(infra):
    with private_stack(
        infra, api_ports=API_PORTS, tiny_workers=1, sim_workers=1, sim_batch_time_ms=200, timeout_s=180
    ) as running:
        yield running


def run_block(example: Example, stack: DevStack, folder: Path) -> Run:
    code = example.code
    for documented, actual in (
        ("127.0.0.1:8000", f"127.0.0.1:{API_PORTS[0]}"),
        ("127.0.0.1:8001", f"127.0.0.1:{API_PORTS[1]}"),
        ("127.0.0.1:9092", stack.cfg.kafka_bootstrap),
    ):
        code = code.replace(documented, actual)
    argv = [sys.executable, "-c", code] if example.lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    env = {
        **os.environ,
        "LLMQ_KAFKA_BOOTSTRAP_SERVERS": stack.cfg.kafka_bootstrap,
        "LLMQ_REDIS_URL": stack.cfg.redis_url,
        "LLMQ_API_URL": f"http://127.0.0.1:{API_PORTS[0]}/v1",
        "COLUMNS": "200",
    }  # rich wraps at the terminal's width: keep the printed lines whole
    started_ms = int(time.time() * 1000)
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"{example} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return Run(done.stdout, started_ms, int(time.time() * 1000), folder)


# --- what each block must print (beyond exiting 0), keyed by a piece of its text ---------------------------------


def fresh_answer(run: Run) -> dict:
    """The FinalResult a kcat block printed last; it must be of the request this run produced (created during it)."""
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.started_ms <= result["created_ms"] <= run.ended_ms, "an older answer, not this run's"
    assert result["outcome"] == "succeeded", result
    return result


def check_sdk(runs: list[Run]) -> None:
    for run in runs:
        sim, tiny = run.stdout.splitlines()
        assert sim == sim_answer("def fib(n):", 16)
        finish_reason, tokens = tiny.split()
        assert finish_reason in ("stop", "length") and 0 < int(tokens) <= 16


def check_curl(runs: list[Run]) -> None:
    for run in runs:
        models, health = run.stdout.splitlines()
        assert {"llmq-sim", "llmq-tiny"} <= {m["id"] for m in json.loads(models)["data"]}
        assert json.loads(health) == {"status": "ok"}


def check_kcat_readme(runs: list[Run]) -> None:
    answers = [fresh_answer(run) for run in runs]
    assert [a["choices"][0]["text"] for a in answers] == [sim_answer("hello", 8)] * 2
    assert answers[0]["request_id"] != answers[1]["request_id"] and answers[0]["request_id"].startswith("r-")


def check_kcat_docs(runs: list[Run]) -> None:
    answers = [fresh_answer(run) for run in runs]
    user = "Hail damage to roof tiles at a ground-floor flat."
    assert [a["choices"][0]["text"] for a in answers] == [sim_answer(user, 48)] * 2
    assert answers[0]["request_id"] != answers[1]["request_id"]


def check_batch_cli(runs: list[Run]) -> None:
    for run in runs:
        out = run.stdout
        assert "wrote 300 lines -> claims.jsonl" in out
        first = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        assert first["method"] == "POST" and first["url"] == "/v1/chat/completions" and first["custom_id"]
        assert re.search(r"status\W+completed", out), out  # the blocking submit's final status
        assert re.search(r"^\w+: \d+ lines -> out\.jsonl", out, re.M), out
        assert len(set(re.findall(r"batch_[a-z0-9-]+-[0-9a-f]{32}", out))) == 2, (
            out
        )  # two batches, each shown by its id


def check_batch_input_file(runs: list[Run]) -> None:
    lines = (runs[-1].folder / "claims.jsonl").read_text().splitlines()
    assert [json.loads(line)["custom_id"] for line in lines] == ["claim-1", "claim-2"]


def check_batch_sdk(runs: list[Run]) -> None:
    prompts = {
        "claim-1": "Hail damage to roof tiles at a ground-floor flat.",
        "claim-2": "A laptop stolen from a parked car.",
    }
    for run in runs:
        status, *output = [line for line in run.stdout.splitlines() if line.strip()]
        assert status.startswith("completed") and "completed=2" in status, status
        answers = {
            o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in map(json.loads, output)
        }
        assert answers == {cid: sim_answer(text, 32) for cid, text in prompts.items()}


def check_batch_cli_submit(runs: list[Run]) -> None:
    for run in runs:
        assert re.search(r"status\W+completed", run.stdout) and "2 total, 2 completed, 0 failed" in run.stdout


def check_batch_run(runs: list[Run]) -> None:
    for run in runs:  # the second run resumes the finished job: same summary, from the manifest
        assert re.search(r"requests\W+300: 300 accepted, 0 dead-lettered", run.stdout), run.stdout
    out = (runs[-1].folder / "job.out.jsonl").read_text().splitlines()
    assert [json.loads(line)["custom_id"] for line in out] == [
        json.loads(line)["custom_id"] for line in (runs[-1].folder / "job.jsonl").read_text().splitlines()
    ]
    assert (runs[-1].folder / "job.out.jsonl.state" / "manifest.sqlite").exists()


def check_both_sdks(runs: list[Run]) -> None:
    for run in runs:
        same, streamed, counted = run.stdout.splitlines()
        assert same == "True max_tokens length" and streamed == sim_answer("Say hi", 8)
        assert int(counted) > 0


def check_resumed_stream(runs: list[Run]) -> None:
    for run in runs:  # the text before the drop and after the resume: one generation, nothing repeated or missing
        assert run.stdout.rstrip("\n") == sim_answer("Once upon a time", 48)


CHECKS = {
    ("README.md", 'model="llmq-sim", prompt="def fib(n):"'): check_sdk,
    ("README.md", "/healthz"): check_curl,
    ("README.md", "-t my.replies"): check_kcat_readme,
    ("README.md", "llmq batch sample"): check_batch_cli,
    ("docs/batch-jobs.md", "cat > claims.jsonl"): check_batch_input_file,
    ("docs/batch-jobs.md", "client.batches.create"): check_batch_sdk,
    ("docs/batch-jobs.md", "batch submit claims.jsonl"): check_batch_cli_submit,
    ("docs/batch-jobs.md", "llmq batch run job.jsonl"): check_batch_run,
    ("docs/kafka-producers.md", "claims-etl.replies -o"): check_kcat_docs,
    ("docs/anthropic.md", "claude.messages.create"): check_both_sdks,
    ("docs/api.md", 'Last-Event-ID": str(len(text))'): check_resumed_stream,
}


def checks_of(example: Example) -> list:
    return [check for (doc, piece), check in CHECKS.items() if doc == example.doc and piece in example.code]


def test_every_output_check_finds_exactly_one_block():
    for doc, piece in CHECKS:
        assert len([e for e in RUNS if e.doc == doc and piece in e.code]) == 1, (doc, piece)


@pytest.mark.parametrize("doc", sorted({e.doc for e in RUNS}))
def test_the_examples_of_a_document_run_verbatim_twice_in_a_row(doc, stack, tmp_path):
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    blocks = [e for e in RUNS if e.doc == doc]
    runs = {e: [] for e in blocks}
    for _ in range(2):
        for example in blocks:
            runs[example].append(run_block(example, stack, tmp_path))
    for example, example_runs in runs.items():
        for check in checks_of(example):
            check(example_runs)


def test_dev_status_names_every_process_port(stack):
    shown = subprocess.run(
        [
            str(ROOT / ".venv/bin/llmq"),
            "dev",
            "status",
            "--json",
            "--state-dir",
            str(stack.cfg.state_dir),
            "--redis-port",
            str(stack.cfg.redis_port),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = {row["name"]: row for row in json.loads(shown.stdout)}
    if infra_kind() == "processes":  # in containers they are testcontainers', not processes of the state dir
        assert rows["redis"]["port"] == stack.cfg.redis_port and rows["kafka"]["port"] == stack.cfg.kafka_port
    else:
        assert "redis" not in rows and "kafka" not in rows
    base = API_PORTS[0] + 10
    assert (rows["result-router"]["port"], rows["batcher"]["port"]) == (base, base + 1)
    workers = sorted(row["metrics_port"] for name, row in rows.items() if name.startswith("worker-"))
    assert workers == [base + 2, base + 3]
    api_metrics = [base + 2 + len(workers) + i for i in range(2)]  # /metrics is off the API port, after the workers'
    assert [rows[f"api-{i}"]["metrics_port"] for i in range(2)] == api_metrics
    assert all(row["port"] and row["health"] == "healthy" for row in rows.values()), rows

"""docs/compose.md's compose steps, verbatim, in order, on a Docker engine (the ```bash blocks whose skip mark names
the compose lane: tests/doc_examples.py). Skips like the rest of tests/compose when no engine answers.

As the docs test does for the dev stack, the documented API addresses (127.0.0.1:8000 and :8001) are replaced by ports
allocated for the run, which compose publishes through LLMQ_COMPOSE_API_0_PORT / _1_PORT; COMPOSE_PROJECT_NAME keeps
this stack apart from a user's own. Each block runs once (the last takes the stack down), from the repository root.
"""

from __future__ import annotations

import os
import subprocess

from tests import ports
from tests.compose.test_compose_stack import leftovers, pytestmark  # noqa: F401 (the lane's skip)
from tests.doc_examples import ROOT, examples

DOC = ROOT / "docs" / "compose.md"
BLOCKS = [e for e in examples(DOC) if e.in_compose_lane]
PROJECT = "llmq-compose-docs"
BLOCK_TIMEOUT_S = 900  # the first block builds the images: minutes when their caches are cold


def test_the_doc_has_compose_steps():
    assert len(BLOCKS) >= 3 and "docker compose down -v" in BLOCKS[-1].code


def test_the_compose_steps_run_verbatim():
    base = ports.block(2)
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": PROJECT,
        "LLMQ_COMPOSE_API_0_PORT": str(base),
        "LLMQ_COMPOSE_API_1_PORT": str(base + 1),
        "COLUMNS": "200",
    }
    try:
        for block in BLOCKS:
            code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{base}").replace(
                "127.0.0.1:8001", f"127.0.0.1:{base + 1}"
            )
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=BLOCK_TIMEOUT_S,
            )  # fmt: skip
            assert done.returncode == 0, (
                f"{block} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
            print(f"\n{block}: ok\n{done.stdout[-600:]}")
    finally:
        subprocess.run(["docker", "compose", "-p", PROJECT, "down", "-v"], cwd=ROOT, env=env, capture_output=True)
    assert leftovers(env, PROJECT) == []

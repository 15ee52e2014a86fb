"""``make compose-test``: the compose stack in containers, driven from outside through its ports on 127.0.0.1 only.

Its own lane, never part of ``make test``: it runs only when LLMQ_COMPOSE_TEST=1 (the make target sets it) and a Docker
engine answers, with the images of ``make images`` and the Compose v2 plugin of ``make compose-plugin``; otherwise it
skips, saying which is missing. One stack for the module (project ``llmq-compose-test``, batchers and result-routers
scaled to 2, the API pods on ports allocated for the run): up healthy; ``llmq bench``'s open-loop mix (classes, tenants,
streams) and the fault tests' counting load generators (tests/system/faults/loadgen.py) through a ``docker compose
kill`` of a worker and of the batchers, then ``up -d``; nothing lost or answered twice; ``down -v`` leaves nothing.
Figures: var/compose-test/report.json (docs/compose.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmq_bench.loadgen import wait_ready
from llmq_cli.compose_secrets import api_keys
from llmq_core.status import ErrorCode
from tests import ports
from tests.infra import docker_engine_answers
from tests.system.faults.loadgen import Ending, HttpLoad, Tally
from tests.system.faults.report import FaultReport

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "llmq-compose-test"
SCALE = ("--scale", "batcher=2", "--scale", "result-router=2")
REPORT = ROOT / "var" / "compose-test" / "report.json"
LOGS = REPORT.parent / "compose.log"  # every container's log of the last run, kept for a failure's cause
UP_TIMEOUT_S = 600  # a cold start on a busy 2-core machine: torch workers import torch and load their models
LOAD_RATE_PER_S = 1.5  # per mix below: 6 requests/s of counted load beside the bench's
BENCH_RATE_PER_S = 6.0
TIMEOUT_MS = 60_000  # each request's deadline: the batchers' restart fits inside it
RETRY_LATER = (429, 503)  # shed or unavailable for now, with Retry-After
WORKER_LOST = "The stream was interrupted after"  # the worker's stream_interrupted message (llmq_worker.answers)


def _missing() -> str | None:
    if os.environ.get("LLMQ_COMPOSE_TEST") != "1":
        return "the compose lane runs under `make compose-test` only (LLMQ_COMPOSE_TEST=1)"
    if not docker_engine_answers(os.environ.get("DOCKER_HOST")):
        return "no Docker engine answers (DOCKER_HOST or /var/run/docker.sock)"
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        return "no Compose v2 plugin: make compose-plugin"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def compose(*args: str, env: dict[str, str], check: bool = True, timeout_s: float = 120) -> str:
    argv = ["docker", "compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def leftovers(env: dict[str, str], project: str = PROJECT) -> list[str]:
    """The project's containers, volumes and networks still on the engine."""
    label = f"label=com.docker.compose.project={project}"
    found = []
    for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
        out = subprocess.run(["docker", *kind, "-q", "--filter", label], env=env, capture_output=True, text=True)
        found += out.stdout.split()
    return found


def images(env: dict[str, str]) -> list[str]:
    """Every image on the engine (id and tags): a pull would add one."""
    out = subprocess.run(
        ["docker", "image", "ls", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted(out.stdout.splitlines())


@pytest.fixture(scope="module")
def stack():
    base = ports.block(2)
    env = {**os.environ, "LLMQ_COMPOSE_API_0_PORT": str(base), "LLMQ_COMPOSE_API_1_PORT": str(base + 1)}
    compose("down", "-v", "--remove-orphans", env=env)  # an interrupted run's leftovers
    before = images(env)
    started = time.monotonic()
    compose("up", "-d", "--wait", "--wait-timeout", str(UP_TIMEOUT_S), *SCALE, env=env, timeout_s=UP_TIMEOUT_S + 60)
    up_s = time.monotonic() - started
    asyncio.run(wait_ready([f"http://127.0.0.1:{base}/v1", f"http://127.0.0.1:{base + 1}/v1"], 60))
    yield {"env": env, "ports": [base, base + 1], "up_s": up_s}
    LOGS.parent.mkdir(parents=True, exist_ok=True)
    LOGS.write_text(compose("logs", "--no-color", "--timestamps", env=env, check=False))
    compose("down", "-v", "--remove-orphans", env=env)
    assert leftovers(env) == [], "docker compose down -v left these behind"
    assert images(env) == before, "the run added an image: something was pulled"


def test_the_stack_is_healthy_with_two_batchers_and_two_routers_of_their_own_ids(stack):
    states = [json.loads(line) for line in compose("ps", "-a", "--format", "json", env=stack["env"]).splitlines()]
    for state in states:
        if state["Service"] == "topics":
            assert state["State"] == "exited" and state["ExitCode"] == 0, state
        else:
            assert state["State"] == "running" and state["Health"] in ("healthy", ""), state
    for service in ("batcher", "result-router"):
        assert sum(s["Service"] == service for s in states) == 2, service
        logs = compose("logs", "--no-log-prefix", service, env=stack["env"])
        started = {m.group(1) for m in re.finditer(rf'"msg":"{service} (\S+) started"', logs)}
        assert len(started) == 2, f"{service} replicas' instance ids: {started}"
    print(f"\ncompose up -d --wait: healthy in {stack['up_s']:.0f} s")


def test_bench_mix_and_counted_load_through_killed_worker_and_batchers(stack):
    env, api = stack["env"], stack["ports"]
    keys = api_keys(ROOT / "deploy" / "secrets")
    paid, free = keys["compose-paid"], keys["compose-free"]
    mixes = {
        "paid interactive": HttpLoad(api, rate_per_s=LOAD_RATE_PER_S, timeout_ms=TIMEOUT_MS, key=paid),
        "paid near_interactive stream": HttpLoad(
            api, rate_per_s=LOAD_RATE_PER_S, timeout_ms=TIMEOUT_MS, key=paid, stream=True,
            traffic_class="near_interactive",
        ),
        "free interactive stream": HttpLoad(
            api, rate_per_s=LOAD_RATE_PER_S, timeout_ms=TIMEOUT_MS, key=free, stream=True
        ),
        "free near_interactive": HttpLoad(
            api, rate_per_s=LOAD_RATE_PER_S, timeout_ms=TIMEOUT_MS, key=free, traffic_class="near_interactive"
        ),
    }  # fmt: skip
    bench = [
        sys.executable, "-m", "llmq_cli.main", "bench", "--json", "--redis-url", "none", "--rate", str(BENCH_RATE_PER_S),
        "--duration-s", "45", "--count", "1000", "--keys", f"{paid}=0.7,{free}=0.3", "--stream-share", "0.3",
        "--classes", "interactive=0.7,near_interactive=0.2,deferred=0.1", "--timeout-s", str(TIMEOUT_MS / 1000 + 5),
        *(arg for port in api for arg in ("--base-url", f"http://127.0.0.1:{port}/v1")),
    ]  # fmt: skip

    async def run() -> tuple[dict[str, Tally], dict, float, float]:
        bench_run = await asyncio.create_subprocess_exec(
            *bench, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        for load in mixes.values():
            load.start()
        await asyncio.sleep(10)  # steady load first
        fault_s = time.monotonic()
        await asyncio.to_thread(compose, "kill", "worker-sim-0", "batcher", env=env)
        await asyncio.to_thread(compose, "up", "-d", "--wait", "--wait-timeout", "300", *SCALE, env=env, timeout_s=360)
        rejoined_s = time.monotonic()
        await asyncio.sleep(15)  # load after the killed services rejoined
        tallies = {name: await load.stop() for name, load in mixes.items()}
        out, _ = await bench_run.communicate()
        return tallies, json.loads(out), fault_s, rejoined_s

    tallies, bench_report, fault_s, rejoined_s = asyncio.run(run())
    report = FaultReport(REPORT)
    for name, tally in tallies.items():
        report.record_split(
            f"compose kill worker-sim-0 + batchers: {name}", tally, fault_s, rejoined_s,
            note=f"down and back (kill, then up -d --wait) in {rejoined_s - fault_s:.0f} s",
        )  # fmt: skip
    (REPORT.parent / "bench.json").write_text(json.dumps(bench_report, indent=1))
    from llmq_cli.bench_cmd import print_report
    from llmq_cli.console import make_console

    print()
    print_report(bench_report, make_console())
    print(report.markdown())
    total = Tally(r for tally in tallies.values() for r in tally.records)
    for record in total.failures():
        print(f"not answered once: {record}")
    assert total.count(Ending.LOST) == total.count(Ending.DROPPED) == 0, [r for r in total.failures()][:5]
    assert total.count(Ending.TWICE) == total.count(Ending.WRONG) == 0, [r for r in total.failures()][:5]
    after = total.where(since_s=rejoined_s)
    assert len(after) > 0 and after.failures() == [], after.failures()[:5]  # the killed services serve again
    # Until the rejoin, a request may also end with a retryable answer that says so, never lost: 429 or 503 with
    # Retry-After (admission sheds while the backlog the kill left drains; a produce past LLMQ_API_PRODUCE_TIMEOUT_MS
    # on a starved machine is 503, its Cancel sent), or, for a stream that worker-sim-0 was generating when it was
    # killed, its text partly sent, the stream_interrupted event (docs/api.md, Streaming), never run twice.
    errors = [r for r in total.where(until_s=rejoined_s).failures() if not (r.status in RETRY_LATER and r.retry_after)]
    assert all(r.detail.startswith(f"stream error event: {WORKER_LOST}") for r in errors), errors
    # The bench's requests likewise: answered, 429, 503, 504 or an interrupted stream; no client-side error or timeout
    other = set(bench_report["status"]) - {"ok", "429", "503", "504", f"stream_{ErrorCode.STREAM_INTERRUPTED}"}
    assert other == set(), bench_report["errors"]

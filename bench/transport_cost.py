"""What secure mode costs per request, measured side by side with plaintext in one run (docs/security.md).

Two private stacks run at once on this machine: one plaintext, one ``--secure`` (Kafka SASL_SSL + ACLs, Redis TLS +
ACL users), each an API pod, batcher, result-router and one llmq-sim worker with a 5 ms batch time. Rounds alternate
between them (so drift on a shared machine hits both): sequential requests give the latency, a concurrent burst the
CPU time per request (every process of that stack, Kafka and Redis included, from /proc).

Run: ``.venv/bin/python bench/transport_cost.py`` (writes ``bench/results/transport_cost.json``; stops what it started).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import httpx

from llmq_cli.devstack import DevStack, StackConfig

ROUNDS = 4
SEQUENTIAL = 100  # per round and mode: latency
BURST, CONCURRENCY = 300, 16  # per round and mode: CPU per request
WARMUP = 50
BODY = {"model": "llmq-sim", "prompt": "the transport costs " * 8, "max_tokens": 16}
HEADERS = {"authorization": "Bearer llmq-dev-key"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RESULT = Path("bench/results/transport_cost.json")


def stacks(state: Path) -> dict[str, DevStack]:
    shape = dict(tiny_workers=0, sim_workers=1, sim_batch_time_ms=5)
    return {
        "plaintext": DevStack(
            StackConfig(state_dir=state / "plain", kafka_port=29092, redis_port=26379, api_ports=(28000,), **shape)
        ),
        "secure": DevStack(
            StackConfig(
                state_dir=state / "secure", kafka_port=29192, redis_port=26479, api_ports=(28100,), secure=True, **shape
            )
        ),
    }


def cpu_s(stack: DevStack) -> float:
    """User + system CPU seconds so far of every process the stack started."""
    total = 0
    for row in stack.status():
        fields = Path(f"/proc/{row['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


async def ask(http: httpx.AsyncClient, url: str) -> float:
    started = time.perf_counter()
    response = await http.post(url, json=BODY, headers=HEADERS)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def round_of(stack: DevStack, http: httpx.AsyncClient) -> tuple[list[float], float]:
    """Latencies (ms) of SEQUENTIAL requests one after another, then CPU ms per request of a concurrent burst."""
    url = f"http://127.0.0.1:{stack.cfg.api_ports[0]}/v1/completions"
    latencies = [await ask(http, url) for _ in range(SEQUENTIAL)]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            await ask(http, url)

    before = cpu_s(stack)
    await asyncio.gather(*(one() for _ in range(BURST)))
    return latencies, (cpu_s(stack) - before) * 1000 / BURST


async def measure(running: dict[str, DevStack]) -> dict:
    latencies: dict[str, list[float]] = {mode: [] for mode in running}
    cpu_ms: dict[str, list[float]] = {mode: [] for mode in running}
    async with httpx.AsyncClient(timeout=60) as http:
        for stack in running.values():
            for _ in range(WARMUP):
                await ask(http, f"http://127.0.0.1:{stack.cfg.api_ports[0]}/v1/completions")
        for _ in range(ROUNDS):
            for mode, stack in running.items():
                lat, cpu = await round_of(stack, http)
                latencies[mode] += lat
                cpu_ms[mode].append(cpu)
    report = {}
    for mode in running:
        ordered = sorted(latencies[mode])
        report[mode] = {
            "requests": len(ordered),
            "latency_p50_ms": round(statistics.median(ordered), 2),
            "latency_p95_ms": round(ordered[int(len(ordered) * 0.95)], 2),
            "cpu_ms_per_request": round(statistics.median(cpu_ms[mode]), 2),
            "cpu_ms_per_request_rounds": [round(value, 2) for value in cpu_ms[mode]],
        }
    plain, secure = report["plaintext"], report["secure"]
    report["secure_minus_plaintext"] = {
        key: round(secure[key] - plain[key], 2) for key in ("latency_p50_ms", "latency_p95_ms", "cpu_ms_per_request")
    }
    return report


def main() -> None:
    running = stacks(Path("var/transport-cost").resolve())
    try:
        for stack in running.values():
            stack.up(log=lambda *_: None)
        report = asyncio.run(measure(running))
    finally:
        for stack in running.values():
            stack.down()
    report["shape"] = {"rounds": ROUNDS, "sequential": SEQUENTIAL, "burst": BURST, "concurrency": CONCURRENCY}
    report["cpus"] = os.cpu_count()
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

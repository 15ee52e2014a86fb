"""Pipeline efficiency side by side: the Kafka + Redis floor, llmq at 1 and at 64 in flight, Ray Serve at the same points.

One run, on this machine, on private stacks:
1. The floor, on the stack's own broker and Redis, with fixed client settings (tuning llmq does not move it): one
   aiokafka produce (acks=all, idempotent, linger 0) -> consume (the consumer's defaults) hop, one message at a time,
   and one Redis pub/sub hop. llmq's critical path is two Kafka hops and one Redis hop: the floor is their sum.
2. llmq (two ``llmq-sim`` workers, ``batch_time_ms`` per batch, batch window 0) at 1 in flight and closed loop at
   ``concurrency`` in flight: end to end p50/p99, overhead (end to end minus engine time), throughput, and CPU ms per
   request of every process of the stack, the broker included (utime + stime from /proc, children included), the load
   generator's own CPU per request and the machine's busy fraction (/proc/stat) meanwhile.
3. Ray Serve (``llmq_bench.ray_peer``, same model, batch time and replicas, ``batch_wait_timeout_s``) at the same points.

The stack comes from the caller (``llmq bench pipeline`` starts it, possibly from another checkout): this module only
needs its pids and ports. Run: ``llmq bench pipeline`` (``--baseline DIR`` measures another checkout in the same run).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

from llmq_bench.loadgen import client_session, json_body, percentile
from llmq_bench.ray_peer import PeerConfig, RayPeer

FLOOR_TOPIC = "bench.floor"
FLOOR_CHANNEL = "bench:floor"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROMPT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


@dataclass(frozen=True)
class PipelineConfig:
    """What to measure: request counts per point (after ``warmup`` unmeasured ones), the floor's message count, and
    ``peer``: the shape both systems run at (llmq-sim workers as Ray's replicas) and Ray Serve's port."""

    requests: int = 2000
    light_requests: int = 500
    warmup: int = 200
    concurrency: int = 64
    floor_messages: int = 500
    peer: PeerConfig = PeerConfig(replicas=2, max_batch_size=64, batch_time_ms=5, batch_wait_timeout_s=0.005)
    max_tokens: int = 8
    api_key: str = "llmq-dev-key"
    timeout_s: float = 30.0


class Stack(Protocol):
    """A running private stack: its API base URLs, Kafka bootstrap, Redis URL and pids by process name."""

    base_urls: Sequence[str]
    kafka_bootstrap: str
    redis_url: str

    def pids(self) -> dict[str, int]: ...


# --- pure parts ----------------------------------------------------------------------------------------------------


def latency_figures(e2e_ms: Sequence[float], engine_ms: float) -> dict:
    """p50/p99 of end to end latency and of overhead (end to end minus ``engine_ms``), ms."""
    return {
        "e2e_p50_ms": round(percentile(e2e_ms, 50), 3),
        "e2e_p99_ms": round(percentile(e2e_ms, 99), 3),
        "overhead_p50_ms": round(percentile(e2e_ms, 50) - engine_ms, 3),
        "overhead_p99_ms": round(percentile(e2e_ms, 99) - engine_ms, 3),
    }


def cpu_per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict:
    """CPU ms per request of each process (``after - before`` CPU seconds over ``requests``) and their total."""
    per = {name: round((after[name] - before.get(name, 0.0)) * 1000 / requests, 4) for name in sorted(after)}
    return {"per_process_ms": per, "total_ms": round(sum(per.values()), 4)}


def floor_figures(kafka_ms: Sequence[float], redis_ms: Sequence[float]) -> dict:
    """The critical path's floor: two Kafka hops and one Redis hop, p50 and p99 (ms)."""
    k50, k99 = percentile(kafka_ms, 50), percentile(kafka_ms, 99)
    r50, r99 = percentile(redis_ms, 50), percentile(redis_ms, 99)
    return {
        "kafka_hop_p50_ms": round(k50, 3),
        "kafka_hop_p99_ms": round(k99, 3),
        "redis_hop_p50_ms": round(r50, 3),
        "redis_hop_p99_ms": round(r99, 3),
        "p50_ms": round(2 * k50 + r50, 3),
        "p99_ms": round(2 * k99 + r99, 3),
    }


def goals(run: dict, floor: dict, baseline: dict | None, ray: dict | None) -> dict:
    """The issue's ratios: light-load overhead over the floor, CPU per request at saturation over the baseline's and
    Ray's, saturation throughput over the baseline's (None where a side is missing)."""
    light, sat = run["light"], run["saturation"]

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    return {
        "light_overhead_p50_over_floor": ratio(light["overhead_p50_ms"], floor["p50_ms"]),
        "light_overhead_p99_over_floor": ratio(light["overhead_p99_ms"], floor["p99_ms"]),
        "saturation_cpu_over_baseline": ratio(
            sat["cpu"]["total_ms"], baseline and baseline["saturation"]["cpu"]["total_ms"]
        ),
        "saturation_cpu_over_ray": ratio(sat["cpu"]["total_ms"], ray and ray["saturation"]["cpu"]["total_ms"]),
        "saturation_rps_over_baseline": ratio(
            sat["throughput_rps"], baseline and baseline["saturation"]["throughput_rps"]
        ),
    }


# --- /proc ---------------------------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every live descendant, plus what their waited-for children used."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        fields = _stat_fields(pid)
        if fields is None:
            continue
        total += sum(int(x) for x in fields[11:15]) / CLK_TCK  # utime stime cutime cstime
        todo.extend(children.get(pid, ()))
    return total


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: process_tree_cpu_s(pid) for name, pid in pids.items()}


def parse_machine_ticks(proc_stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat's ``cpu`` line: user nice system idle iowait irq softirq
    steal (guest time is inside user); idle and iowait are not busy."""
    ticks = [int(x) for x in proc_stat.split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def machine_ticks() -> tuple[int, int]:
    return parse_machine_ticks(Path("/proc/stat").read_text())


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time (all cores) that was busy between two :func:`machine_ticks` readings."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total else 0.0


# --- the floor -----------------------------------------------------------------------------------------------------


async def kafka_floor(bootstrap: str, messages: int) -> list[float]:
    """Latencies (ms) of ``messages`` produce -> consume hops, one at a time, with fixed client settings."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(FLOOR_TOPIC, 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await producer.start()
    await consumer.start()
    try:
        tp = TopicPartition(FLOOR_TOPIC, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await producer.send_and_wait(FLOOR_TOPIC, b"warm")
        await consumer.getone()
        latencies = []
        for i in range(messages):
            start = time.perf_counter()
            await producer.send(FLOOR_TOPIC, str(i).encode())
            await consumer.getone()
            latencies.append((time.perf_counter() - start) * 1000)
        return latencies
    finally:
        await producer.stop()
        await consumer.stop()


async def redis_floor(url: str, messages: int) -> list[float]:
    """Latencies (ms) of ``messages`` PUBLISH -> subscriber hops, one at a time."""
    from redis.asyncio import Redis

    publisher, subscriber = Redis.from_url(url), Redis.from_url(url)
    pubsub = subscriber.pubsub()
    try:
        await pubsub.subscribe(FLOOR_CHANNEL)
        await pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        latencies = []
        for i in range(messages):
            start = time.perf_counter()
            await publisher.publish(FLOOR_CHANNEL, str(i))
            while await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0) is None:
                pass
            latencies.append((time.perf_counter() - start) * 1000)
        return latencies
    finally:
        await pubsub.aclose()
        await publisher.aclose()
        await subscriber.aclose()


def measure_floor(stack: Stack, cfg: PipelineConfig) -> dict:
    """The floor on ``stack``'s broker and Redis, with the broker's CPU per message sent."""
    kafka_pid = {name: pid for name, pid in stack.pids().items() if name == "kafka"}
    before = cpu_snapshot(kafka_pid)
    kafka_ms = asyncio.run(kafka_floor(stack.kafka_bootstrap, cfg.floor_messages))
    after = cpu_snapshot(kafka_pid)
    redis_ms = asyncio.run(redis_floor(stack.redis_url, cfg.floor_messages))
    figures = floor_figures(kafka_ms, redis_ms)
    if kafka_pid:
        figures["broker_cpu_ms_per_message"] = round((after["kafka"] - before["kafka"]) * 1000 / cfg.floor_messages, 4)
    return figures


# --- closed-loop load ----------------------------------------------------------------------------------------------


async def closed_loop(
    base_urls: Sequence[str], cfg: PipelineConfig, concurrency: int, count: int, model: str = "llmq-sim"
) -> tuple[list[float], float, int]:
    """``count`` non-streaming completions, ``concurrency`` in flight, round robin over ``base_urls``: (latencies ms
    of the successes, wall seconds, failures). aiohttp, one keep-alive session per base URL (see
    :func:`llmq_bench.loadgen.client_session` for why not httpx): every system of a run is driven by this same client."""
    sessions = [client_session(concurrency, cfg.timeout_s) for _ in base_urls]
    urls = [f"{url}/completions" for url in base_urls]
    headers = {"authorization": f"Bearer {cfg.api_key}", "content-type": "application/json"}
    body = json_body({"model": model, "prompt": PROMPT, "max_tokens": cfg.max_tokens, "temperature": 0})
    latencies: list[float] = []
    failures = 0
    issued = 0

    async def one_lane(lane: int) -> None:
        nonlocal failures, issued
        session, url = sessions[lane % len(sessions)], urls[lane % len(urls)]
        while issued < count:
            issued += 1
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append((time.perf_counter() - start) * 1000)
            else:
                failures += 1

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one_lane(i) for i in range(concurrency)))
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    return latencies, time.perf_counter() - start, failures


def measure_point(
    base_urls: Sequence[str],
    pids: Callable[[], dict[str, int]],
    cfg: PipelineConfig,
    concurrency: int,
    count: int,
    profile_dir: Path | None = None,
) -> dict:
    """One load point: warm-up, then ``count`` requests at ``concurrency`` with every process's CPU read around it;
    ``profile_dir``: py-spy samples every Python process meanwhile, and a summary of each goes into the result."""
    asyncio.run(closed_loop(base_urls, cfg, concurrency, cfg.warmup))
    processes = pids()
    spies = start_profiles(processes, profile_dir) if profile_dir else {}
    before, machine_before, loadgen_before_s = cpu_snapshot(processes), machine_ticks(), time.process_time()
    latencies, wall_s, failures = asyncio.run(closed_loop(base_urls, cfg, concurrency, count))
    loadgen_s, machine_after, after = time.process_time() - loadgen_before_s, machine_ticks(), cpu_snapshot(processes)
    profiles = stop_profiles(spies)
    done = len(latencies) + failures
    return {
        **({"profiles": profiles} if profiles else {}),
        "concurrency": concurrency,
        "requests": done,
        "failures": failures,
        "throughput_rps": round(len(latencies) / wall_s, 2),
        **latency_figures(latencies, cfg.peer.batch_time_ms),
        "cpu": cpu_per_request(before, after, max(done, 1)),
        # Whether the machine or the pipeline is the limit: the load generator (this process) shares the cores.
        "loadgen_cpu_ms_per_request": round(loadgen_s * 1000 / max(done, 1), 4),
        "machine_busy_fraction": busy_fraction(machine_before, machine_after),
    }


def measure_system(
    base_urls: Sequence[str], pids: Callable[[], dict[str, int]], cfg: PipelineConfig, log, profile_dir=None
) -> dict:
    """Light load (1 in flight) then saturation (``cfg.concurrency`` in flight, profiled into ``profile_dir``)."""
    light = measure_point(base_urls, pids, cfg, 1, cfg.light_requests)
    log(f"  1 in flight: p50 {light['e2e_p50_ms']} ms, p99 {light['e2e_p99_ms']} ms")
    sat = measure_point(base_urls, pids, cfg, cfg.concurrency, cfg.requests, profile_dir)
    log(
        f"  {cfg.concurrency} in flight: {sat['throughput_rps']} req/s, {sat['cpu']['total_ms']} CPU ms per request"
        f" (load generator {sat['loadgen_cpu_ms_per_request']}), machine {sat['machine_busy_fraction']:.0%} busy"
    )
    return {"light": light, "saturation": sat}


def measure_llmq(stack: Stack, cfg: PipelineConfig, log, profile_dir: Path | None = None) -> dict:
    """The floor and both points on one running llmq stack."""
    floor = measure_floor(stack, cfg)
    log(f"  floor: p50 {floor['p50_ms']} ms, p99 {floor['p99_ms']} ms")
    return {"floor": floor, **measure_system(stack.base_urls, stack.pids, cfg, log, profile_dir)}


# --- profiles --------------------------------------------------------------------------------------------------------


def start_profiles(pids: dict[str, int], folder: Path) -> dict[str, tuple[subprocess.Popen, Path]]:
    """py-spy (the ``bench`` extra) sampling each process but Kafka and Redis, into ``folder/<name>.txt``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    spies = {}
    for name, pid in pids.items():
        if name in ("kafka", "redis"):
            continue
        out = folder / f"{name}.txt"
        argv = [spy, "record", "-r", "50", "-f", "raw", "-o", str(out), "-p", str(pid)]
        spies[name] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
    return spies


def stop_profiles(spies: dict[str, tuple[subprocess.Popen, Path]]) -> dict:
    """Stop the samplers (SIGINT: py-spy writes what it has) and summarize each profile."""
    for proc, _ in spies.values():
        proc.send_signal(signal.SIGINT)
    summaries = {}
    for name, (proc, out) in spies.items():
        proc.wait(timeout=30)
        if out.exists():
            summaries[name] = profile_summary(out.read_text())
    return summaries


_FRAME_PATH = re.compile(r" \((?:[^)]*/)?([^/)]+?)(?::\d+)?\)")


def profile_summary(raw: str, top: int = 12) -> dict:
    """Of py-spy's raw (collapsed) stacks: the samples, and the functions with the largest shares of them, by their own
    time (self) and with their callees (inclusive); frames named ``function (file)``."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_FRAME_PATH.sub(r" (\1)", frame) for frame in stack.split(";")]
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)

    def shares(counter):
        return [[frame, round(n / total, 3)] for frame, n in counter.most_common(top)] if total else []

    return {"samples": total, "self": shares(own), "inclusive": shares(inclusive)}


def ray_pids(own_pid: int) -> dict[str, int]:
    """The processes Ray started from this one (raylet, GCS, workers...), by name and pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None and int(fields[1]) == own_pid:
            name = Path(f"/proc/{entry}/comm").read_text().strip()
            found[f"{name}-{entry}"] = int(entry)
    return found


def measure_ray(cfg: PipelineConfig, log) -> dict:
    """Ray Serve with llmq's replicas, batch size and batch time, at the same points."""
    peer = RayPeer(cfg.peer, temp_dir=f"/tmp/ray-llmq-pipeline-{uuid.uuid4().hex[:6]}")
    peer.start()
    try:
        return measure_system([peer.base_url], lambda: ray_pids(os.getpid()), cfg, log)
    finally:
        peer.stop()


def write_result(result: dict, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")

"""A guard against efficiency regressions that times nothing: what the pipeline sends per request, counted in every
service process of a real stack (Kafka requests by kind, records produced, Redis round trips; see
counting/sitecustomize.py), must stay under bounds. Offset commits are bounded by the commit window
(KAFKA_COMMIT_INTERVAL_MS per committing consumer over the run), not by the requests: a commit per record or per batch
fails here."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmq_bench.pipeline import PipelineConfig, closed_loop, measure_llmq
from llmq_core.constants import KAFKA_COMMIT_INTERVAL_MS
from tests import ports
from tests.stacks import private_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
REQUESTS = 600
IN_FLIGHT = 16
COMMITTING_CONSUMERS = 4  # batcher, two workers, result-router
# Records produced per request: the request, its batch's share (one record per batch) and its result, so at most 3;
# any record more per request (a second produce on some hop, a per-request stats record) fails here at any load.
MAX_RECORDS_PER_REQUEST = 3.0
# Per request, measured 2026-11-30 (16 in flight, 5 ms batches, 300 req/s): fetch requests 0.66, offset commits 0.065
# (the window's bound), Redis round trips 1.55. Produce requests group the records that queue behind each producer's
# one request in flight, so per request they follow how fast the broker acks and the request rate (0.9-1.8 at 70-400
# req/s on a busy machine; the local broker on C1 acks sooner than it did with C2, so fewer records wait): bounded per
# record produced instead, measured 0.42 at 180 req/s. A producer that waited for each record's ack before sending
# the next needs one per record.
MAX_PRODUCE_REQUESTS_PER_RECORD = 0.8
MAX_FETCH_REQUESTS_PER_REQUEST = 1.5
MAX_REDIS_ROUND_TRIPS_PER_REQUEST = 2.5
COUNTING = Path(__file__).parent / "counting"


def totals(folder: Path) -> collections.Counter:
    """Every process's counts, summed (each file is one process's running totals)."""
    counts: collections.Counter = collections.Counter()
    for path in folder.glob("*.json"):
        counts.update(json.loads(path.read_text()))
    return counts


def settled(folder: Path, deadline_s: float = 10.0) -> collections.Counter:
    """The totals once every process wrote twice since the call: the second write began after the first ended, so it
    holds everything sent before the call."""
    end = time.monotonic() + deadline_s
    for _ in range(2):
        since = {p: time.time_ns() for p in folder.glob("*.json")}
        while not all(p.stat().st_mtime_ns > t for p, t in since.items()):
            assert time.monotonic() < end, f"the counting processes stopped writing to {folder}"
            time.sleep(0.05)
    return totals(folder)


@pytest.fixture(scope="module")
def counted_stack(infra, tmp_path_factory):
    folder = tmp_path_factory.mktemp("counts")
    env = {"PYTHONPATH": str(COUNTING), "LLMQ_TEST_COUNTS_DIR": str(folder)}
    with private_stack(
        infra, api_ports=API_PORTS, tiny_workers=0, sim_workers=2, sim_batch_time_ms=5, extra_env=env
    ) as running:
        yield running, folder


def test_kafka_requests_commits_and_redis_round_trips_per_request_stay_bounded(counted_stack):
    _, folder = counted_stack
    urls = [f"http://127.0.0.1:{port}/v1" for port in API_PORTS]
    cfg = PipelineConfig()
    asyncio.run(closed_loop(urls, cfg, IN_FLIGHT, 50))  # warm-up: connections, metadata, group joins
    before, started = settled(folder), time.monotonic()
    latencies, _, failures = asyncio.run(closed_loop(urls, cfg, IN_FLIGHT, REQUESTS))
    elapsed_s = time.monotonic() - started
    sent = settled(folder) - before
    assert failures == 0 and len(latencies) == REQUESTS

    per_request = {kind: round(n / REQUESTS, 3) for kind, n in sorted(sent.items())}
    print(f"per request over {elapsed_s:.1f} s: {per_request}")
    assert sent["kafka.records"] <= MAX_RECORDS_PER_REQUEST * REQUESTS, per_request
    assert sent["kafka.ProduceRequest"] <= MAX_PRODUCE_REQUESTS_PER_RECORD * sent["kafka.records"], per_request
    assert sent["kafka.FetchRequest"] <= MAX_FETCH_REQUESTS_PER_REQUEST * REQUESTS, per_request
    assert sent["redis.round_trips"] <= MAX_REDIS_ROUND_TRIPS_PER_REQUEST * REQUESTS, per_request
    windows = (elapsed_s + 1) * 1000 / KAFKA_COMMIT_INTERVAL_MS + 1  # + 1 s: the settling reads after the run
    assert sent["kafka.OffsetCommitRequest"] <= COMMITTING_CONSUMERS * windows, per_request


# An API pod's Redis round trips are its own background, none per request of an unlimited tenant (the dev key): the
# saturation poll (one pipeline, 10 a second), its heartbeat and liveness key (one each a second), the replies
# connection's SUBSCRIBE and PING (only when quiet). Three commands per poll would be 32 a second.
MAX_POD_REDIS_ROUND_TRIPS_PER_S = 16


def test_the_api_pods_send_redis_nothing_per_request_and_kafka_no_health_checks_under_load(counted_stack):
    running, folder = counted_stack
    pods = [f"{row['pid']}.json" for row in running.status() if row["name"].startswith("api-")]
    assert len(pods) == len(API_PORTS)
    urls = [f"http://127.0.0.1:{port}/v1" for port in API_PORTS]
    asyncio.run(closed_loop(urls, PipelineConfig(), IN_FLIGHT, 50))
    settled(folder)  # every process wrote what it sent before: the pods' files are their totals until now
    started = time.monotonic()
    before_pods = [json.loads((folder / pod).read_text()) for pod in pods]
    latencies, _, failures = asyncio.run(closed_loop(urls, PipelineConfig(), IN_FLIGHT, REQUESTS))
    settled(folder)
    elapsed_s = time.monotonic() - started
    sent = collections.Counter()
    for pod, earlier in zip(pods, before_pods, strict=True):
        sent.update(collections.Counter(json.loads((folder / pod).read_text())) - collections.Counter(earlier))
    assert failures == 0 and len(latencies) == REQUESTS
    print(f"API pods over {elapsed_s:.1f} s and {REQUESTS} requests: {dict(sent)}")
    assert sent["redis.round_trips"] <= MAX_POD_REDIS_ROUND_TRIPS_PER_S * len(pods) * elapsed_s, dict(sent)
    assert sent["kafka.MetadataRequest"] <= len(pods), dict(sent)  # acked requests stand in for the health check
    assert sent["kafka.ProduceRequest"] <= REQUESTS, dict(sent)


def test_the_pipeline_bench_measures_the_floor_and_both_points_with_cpu_per_process(counted_stack):
    """``llmq bench pipeline``'s measurements with tiny counts on this stack (the command itself starts its own)."""
    running, _ = counted_stack
    stack = SimpleNamespace(
        base_urls=[f"http://127.0.0.1:{port}/v1" for port in API_PORTS],
        kafka_bootstrap=running.cfg.kafka_bootstrap,
        redis_url=running.cfg.redis_url,
        pids=lambda: {row["name"]: row["pid"] for row in running.status()},
    )
    cfg = PipelineConfig(requests=40, light_requests=10, warmup=5, concurrency=8, floor_messages=20)
    result = measure_llmq(stack, cfg, log=lambda *_: None)

    floor = result["floor"]
    assert 0 < floor["kafka_hop_p50_ms"] <= floor["kafka_hop_p99_ms"] and 0 < floor["redis_hop_p50_ms"]
    assert floor["p50_ms"] == pytest.approx(2 * floor["kafka_hop_p50_ms"] + floor["redis_hop_p50_ms"], abs=0.01)
    for point, requests in ((result["light"], 10), (result["saturation"], 40)):
        assert point["requests"] == requests and point["failures"] == 0
        assert point["e2e_p50_ms"] >= cfg.peer.batch_time_ms and point["throughput_rps"] > 0
        per_process = point["cpu"]["per_process_ms"]
        assert {"batcher", "result-router", "api-0", "worker-sim-0"} <= set(per_process)
        assert point["cpu"]["total_ms"] == pytest.approx(sum(per_process.values()), abs=0.01)
        assert point["loadgen_cpu_ms_per_request"] > 0 and 0 < point["machine_busy_fraction"] <= 1

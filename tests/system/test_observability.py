"""Observability of a real stack (processes, Kafka, Redis): traces across all four services, metrics that move.

The stack runs with ``LLMQ_TRACING_EXPORTER=file``: every process appends its spans to its own JSON-lines file, and the
test joins them by trace id. Metrics are scraped from every service's /metrics before and after a few requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time

import httpx
import pytest

from llmq_bench.light_timeline import timeline
from llmq_cli.devstack import DevStack
from llmq_cli.slo import Samples, report, scrape
from tests import ports
from tests.unit.observability.test_trace_pipeline import REQUEST_SPANS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ports.block()
API_PORTS = (BASE, BASE + 1)
AUTH = {"authorization": "Bearer llmq-dev-key"}
SERVICES = {"llmq-api", "llmq-batcher", "llmq-worker", "llmq-result-router"}


@pytest.fixture(scope="module")
def stack(infra, tmp_path_factory):
    if infra is None:
        pytest.skip("needs the suite's own Kafka/Redis (LLMQ_KAFKA_BOOTSTRAP_SERVERS is set)")
    traces = tmp_path_factory.mktemp("traces")
    cfg = dataclasses.replace(
        infra.cfg,
        api_ports=API_PORTS,
        tiny_workers=0,
        sim_workers=1,
        sim_batch_time_ms=100,
        extra_env={"LLMQ_TRACING_EXPORTER": "file", "LLMQ_TRACING_FILE_DIR": str(traces)},
    )
    running = DevStack(cfg)
    try:
        running.up(timeout_s=240, log=lambda *_: None)
        yield running, traces
    finally:
        running.down(services_only=True)
        shutil.rmtree(traces, ignore_errors=True)


def spans_of(traces) -> list[dict]:
    spans = []
    for path in traces.glob("*.jsonl"):
        spans += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return spans


async def ask(client: httpx.AsyncClient, port: int, prompt: str, **extra) -> httpx.Response:
    headers = {**AUTH, **extra.pop("headers", {})}
    response = await client.post(
        f"http://127.0.0.1:{port}/v1/completions",
        headers=headers,
        json={"model": "llmq-sim", "prompt": prompt, "max_tokens": 4, **extra},
    )
    assert response.status_code == 200, response.text
    return response


async def test_one_request_leaves_one_trace_with_spans_of_all_four_services(stack):
    running, traces = stack
    async with httpx.AsyncClient(timeout=60) as client:
        request_id = (await ask(client, API_PORTS[0], "trace me")).headers["x-request-id"]
    deadline = time.monotonic() + 30
    while True:  # each process exports its spans in batches about a second apart, each span once it has ended: the
        spans = spans_of(traces)  # API pod's own ('POST /v1/completions', 'api.reply') end last, after the answer
        ours = [s for s in spans if s["attributes"].get("llmq.request_id") == request_id]
        trace_ids = {s["trace_id"] for s in ours}
        in_trace = [s for s in spans if s["trace_id"] in trace_ids]
        if whole_trace(in_trace) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert len(trace_ids) == 1, trace_ids
    assert whole_trace(in_trace), sorted((s["service"], s["name"], s["span_id"], s["parent_id"]) for s in in_trace)
    # `llmq bench timeline`'s table of the same spans: offsets from the pod's server span, in the path's order
    starts = {row["span"]: row["start_p50_ms"] for row in timeline(in_trace)}
    assert starts["llmq-api:POST /v1/completions"] == 0
    path = ["llmq-api:kafka.produce", "llmq-batcher:batcher.queue", "llmq-batcher:batcher.flush"]
    assert 0 < starts[path[0]] <= starts[path[1]] <= starts[path[2]] < starts["llmq-worker:worker.publish"]


def whole_trace(in_trace: list[dict]) -> bool:
    """Spans of the four services and no other, every span of a request's path, each span's parent too."""
    ids = {s["span_id"] for s in in_trace}
    return (
        {s["service"] for s in in_trace} == SERVICES
        and REQUEST_SPANS <= {s["name"] for s in in_trace}
        and all(s["parent_id"] in ids for s in in_trace if s["name"] != "POST /v1/completions")
    )


async def test_metrics_exist_and_move_when_load_arrives(stack):
    running, _ = stack
    urls = running.metrics_urls()
    assert len(urls) == 5  # two API pods, batcher, one worker, result-router
    before = Samples(scrape(urls.values())[0])
    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(
            *(ask(client, API_PORTS[i % 2], f"load {i}", stream=i % 3 == 0) for i in range(6)),
            ask(client, API_PORTS[0], "near", headers={"x-llmq-class": "near_interactive"}),
            ask(client, API_PORTS[1], "later", headers={"x-llmq-class": "deferred"}),
        )
    await asyncio.sleep(2.5)  # the result-router's consumption and the once-a-second gauges
    texts, failed = scrape(urls.values())
    assert not failed
    after = Samples(texts)

    def moved(name: str, by: float = 1, **labels) -> None:
        assert after.total(name, **labels) - before.total(name, **labels) >= by, (name, labels)

    moved("llmq_api_responses_total", 6, traffic_class="interactive", code="200")
    moved("llmq_api_request_latency_seconds_count", 6, traffic_class="interactive", model="llmq-sim")
    moved("llmq_api_ttft_seconds_count", 6, traffic_class="interactive")
    moved("llmq_batcher_requests_total", 8)
    moved("llmq_batcher_batch_size_requests_count")
    moved("llmq_batcher_flushes_total")
    moved("llmq_batcher_queue_wait_seconds_count", 6, traffic_class="interactive")
    moved("llmq_worker_requests_total", 8, outcome="succeeded")
    moved("llmq_results_total", 6, traffic_class="interactive", outcome="succeeded")
    moved("llmq_results_total", 1, traffic_class="deferred", outcome="succeeded")
    moved("llmq_request_time_to_first_token_seconds_count", 8)
    moved("llmq_request_inter_token_latency_seconds_count", 8)
    moved("llmq_tenant_prompt_tokens_total", 8 * 4, tenant="dev")
    moved("llmq_tenant_completion_tokens_total", 8 * 4, tenant="dev")
    names = {name for name, _ in after.values}
    for gauge in (
        "llmq_batcher_queue_depth",
        "llmq_batcher_oldest_queued_age_seconds",
        "llmq_batcher_prefix_index_blocks",
        "llmq_worker_slots",
        "llmq_worker_utilization_ratio",
        "llmq_kafka_consumer_lag",
    ):
        assert gauge in names, gauge
    slo = report(after)
    assert slo["interactive"]["latency_p95_s"] is not None and slo["interactive"]["ttft_p95_s"] is not None
    assert slo["deferred"]["completed_by_deadline_ratio"] == 1.0

"""llmq_core.metrics: what each service's metrics record, and the /metrics server."""

from __future__ import annotations

import socket
import urllib.request

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from llmq_core import metrics, wire
from llmq_core.labels import LabelSet
from tests.builders import generation_request, heartbeat
from tests.fakes import FakeConsumer

T0 = 1_700_000_000_000


def value(m, name: str, **labels) -> float | None:
    """A sample of ``m``'s registry (None when absent)."""
    return m.registry.get_sample_value(name, labels)


def request(request_id="r1", traffic_class="interactive", created_ms=T0) -> wire.GenerationRequest:
    return wire.GenerationRequest(
        request_id=request_id,
        model="llmq-sim",
        traffic_class=traffic_class,
        prompt="x",
        created_ms=created_ms,
        deadline_ms=created_ms + 1000,
        reply_to=wire.HttpReply(instance_id="p"),
    )


def result(
    outcome=wire.Outcome.SUCCEEDED,
    *,
    ttft_ms=100,
    total_ms=1000,
    completion_tokens=10,
    choices=1,
    traffic_class="interactive",
) -> wire.FinalResult:
    return wire.FinalResult(
        request_id="r1",
        outcome=outcome,
        model="llmq-sim",
        tenant_id="acme",
        reply_to=wire.HttpReply(instance_id="p"),
        choices=[wire.Choice(index=i, text="t") for i in range(choices)],
        usage=wire.Usage(prompt_tokens=7, completion_tokens=completion_tokens, total_tokens=7 + completion_tokens),
        timings=wire.Timings(queued_ms=50, ttft_ms=ttft_ms, total_ms=total_ms),
        traffic_class=traffic_class,
    )


def test_router_counts_a_request_once_with_its_latencies_and_tokens():
    m = metrics.RouterMetrics(LabelSet(tenants=frozenset({"acme"})))
    m.result(result(), first=True)
    m.result(result(), first=False)  # a redelivery
    assert value(m, "llmq_results_total", traffic_class="interactive", model="llmq-sim", outcome="succeeded") == 1
    assert value(m, "llmq_results_duplicates_total") == 1
    assert value(m, "llmq_tenant_prompt_tokens_total", tenant="acme", model="llmq-sim") == 7
    assert value(m, "llmq_tenant_completion_tokens_total", tenant="acme", model="llmq-sim") == 10
    labels = dict(traffic_class="interactive", model="llmq-sim")
    assert value(m, "llmq_request_time_to_first_token_seconds_sum", **labels) == 0.1
    assert value(m, "llmq_request_queue_seconds_sum", **labels) == 0.05
    assert value(m, "llmq_request_duration_seconds_sum", **labels, outcome="succeeded") == 1.0
    # 10 tokens: the 9 after the first took (1000 - 100) ms
    assert abs(value(m, "llmq_request_inter_token_latency_seconds_sum", **labels) - 0.1) < 1e-9


def test_router_inter_token_latency_per_choice_and_unknown_class():
    m = metrics.RouterMetrics()
    m.result(result(completion_tokens=10, choices=2, traffic_class=None), first=True)  # 5 tokens per choice
    labels = dict(traffic_class="unknown", model="llmq-sim")
    assert abs(value(m, "llmq_request_inter_token_latency_seconds_sum", **labels) - 0.9 / 4) < 1e-9
    m.result(result(wire.Outcome.EXPIRED, ttft_ms=0, completion_tokens=0, traffic_class=None), first=True)
    assert value(m, "llmq_request_time_to_first_token_seconds_count", **labels) == 1
    assert value(m, "llmq_results_total", **labels, outcome="expired") == 1


def test_batcher_batches_waits_and_queue_gauges():
    m = metrics.BatcherMetrics()
    reqs = [request("a", created_ms=T0), request("b", "near_interactive", created_ms=T0 - 500)]
    m.dispatched("llmq-sim", "size", reqs, T0 + 100, max_batch=4)
    assert value(m, "llmq_batcher_batch_size_requests_sum", model="llmq-sim", flush_reason="size") == 2
    assert value(m, "llmq_batcher_batch_fill_ratio_sum", model="llmq-sim") == 0.5
    assert value(m, "llmq_batcher_flushes_total", model="llmq-sim", reason="size") == 1
    assert value(m, "llmq_batcher_queue_wait_seconds_sum", traffic_class="near_interactive", model="llmq-sim") == 0.6
    m.queues([("interactive:paid", "llmq-sim", 3, 2500)])
    assert (
        value(m, "llmq_batcher_oldest_queued_age_seconds", priority_class="interactive:paid", model="llmq-sim") == 2.5
    )
    m.queues([])  # the queue emptied: the gauges read 0, not the last value
    assert value(m, "llmq_batcher_queue_depth", priority_class="interactive:paid", model="llmq-sim") == 0
    assert value(m, "llmq_batcher_oldest_queued_age_seconds", priority_class="interactive:paid", model="llmq-sim") == 0


def test_worker_slots_and_utilisation_from_its_heartbeat():
    m = metrics.WorkerMetrics("llmq-sim")
    m.heartbeat(heartbeat(max_slots=8, running=6, queued=1, sent_ms=T0))
    assert value(m, "llmq_worker_utilization_ratio", model="llmq-sim") == 0.75
    assert value(m, "llmq_worker_slots", model="llmq-sim", state="free") == 1
    m.finished(result())
    assert (
        value(m, "llmq_worker_requests_total", traffic_class="interactive", model="llmq-sim", outcome="succeeded") == 1
    )


def test_worker_counts_prefix_cache_hit_and_query_tokens_of_succeeded_requests_and_its_blocks():
    m = metrics.WorkerMetrics("llmq-sim")
    hit = msgspec.structs.replace(result(), usage=wire.Usage.of(7, 10, cached_tokens=5))
    m.finished(hit)
    m.finished(msgspec.structs.replace(hit, outcome=wire.Outcome.CANCELED))  # not counted: it may not have run
    assert value(m, "llmq_worker_prefix_cache_hit_tokens_total", model="llmq-sim") == 5
    assert value(m, "llmq_worker_prefix_cache_query_tokens_total", model="llmq-sim") == 7
    held = [1, 2, 3]
    m.watch_prefix_cache(held)
    assert value(m, "llmq_worker_prefix_cache_blocks", model="llmq-sim") == 3
    held.append(4)
    assert value(m, "llmq_worker_prefix_cache_blocks", model="llmq-sim") == 4


def test_worker_counts_constrained_requests_by_kind_and_its_engines_grammar_cache():
    m = metrics.WorkerMetrics("llmq-sim")
    constrained = [wire.Structured(kind="json_schema", schema="{}"), wire.Structured(kind="tool"), None]
    requests = [generation_request(str(i), structured=c) for i, c in enumerate(constrained)]
    m.batch_taken(
        wire.Batch(batch_id="b", worker_id="w", model="llmq-sim", requests=requests, formed_ms=0, flush_reason="size")
    )
    assert value(m, "llmq_worker_constrained_requests_total", model="llmq-sim", kind="json_schema") == 1
    assert value(m, "llmq_worker_constrained_requests_total", model="llmq-sim", kind="tool") == 1
    stats = metrics.GrammarStats()
    m.watch_grammars(stats)
    stats.compiled(0.002)
    stats.hits += 3
    assert value(m, "llmq_worker_grammar_compiles_total", model="llmq-sim") == 1
    assert value(m, "llmq_worker_grammar_compile_seconds_total", model="llmq-sim") == 0.002
    assert value(m, "llmq_worker_grammar_cache_hits_total", model="llmq-sim") == 3
    assert value(m, "llmq_worker_tool_call_parse_failures_total", model="llmq-sim") == 0


async def test_consumer_lag_per_partition_forgets_revoked_ones():
    from aiokafka import TopicPartition

    m = metrics.BatcherMetrics()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = FakeConsumer(assigned=[a, b])
    consumer.highwaters, consumer.positions = {a: 10, b: 10}, {a: 4, b: 4}
    await m.lag.update(consumer, "g")
    assert value(m, "llmq_kafka_consumer_lag", group="g", topic="t", partition="0") == 6
    consumer.assigned = {a}
    await m.lag.update(consumer, "g")
    assert value(m, "llmq_kafka_consumer_lag", group="g", topic="t", partition="1") is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_exposes_the_registry_and_port_zero_is_off():
    m = metrics.WorkerMetrics("llmq-sim")
    m.finished(result())
    assert metrics.serve(m.registry, 0) is None
    port = free_port()
    stop = metrics.serve(m.registry, port)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        stop()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"llmq_worker_requests", "llmq_worker_slots", "llmq_kafka_consumer_lag"} <= names

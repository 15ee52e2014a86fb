"""One request through all four services in one process, with tracing on and an in-memory exporter: its trace holds
the spans of the API pod, the batcher, the worker and the result-router under one trace id, in one tree.

The services' real I/O edges run (the API's Kafka producer and reply listener, BatcherLoop.ingest/step, WorkerLoop's
take/deliver on a simulated engine, ResultRouter's record handling); fakes stand in for Kafka and Redis, and the test
carries each record from one service to the next.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiokafka import TopicPartition
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmq_api.app import create_app
from llmq_api.pod import KafkaRequestProducer, Pod
from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import BatchPolicy, PolicyConfig
from llmq_core import constants, tracing, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.metrics import BatcherMetrics, RouterMetrics, WorkerMetrics
from llmq_core.settings import Settings
from llmq_result_router.loop import ResultRouter
from llmq_worker.engines.simulated import SimulatedEngine
from llmq_worker.loop import WorkerLoop
from tests.builders import generation_request
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis, Record

# The spans of one request's trace, from the API pod through every service and back (a request that waited for its
# slot adds worker.queue).
REQUEST_SPANS = frozenset(
    {
        "POST /v1/completions",
        "kafka.produce",
        "batcher.queue",
        "batcher.flush",
        "worker.request",
        "worker.prefill",
        "worker.decode",
        "worker.publish",
        "result_router.route",
        "api.reply",
    }
)


class KafkaBus(FakeProducer):
    """The producer of every service, and the worker's consumer too (it commits)."""

    async def commit(self, offsets) -> None:
        pass

    def take(self, topic: str) -> dict:
        (record,) = [r for r in self.sent if r["topic"] == topic]
        self.sent.remove(record)
        return record


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure("test", Settings(), exporter=exporter)
    yield exporter
    tracing.shutdown()


def record(sent: dict, offset: int = 0) -> Record:
    return Record(
        offset=offset, value=sent["value"], headers=tuple(sent["headers"] or ()), key=sent["key"], topic=sent["topic"]
    )


async def until(check, timeout_s: float = 5.0):
    async with asyncio.timeout(timeout_s):
        while not (value := check()):
            await asyncio.sleep(0.005)
    return value


async def test_one_request_is_one_trace_across_api_batcher_worker_and_router(spans):
    bus, pod_redis = KafkaBus(), FakeRedis()
    producer = KafkaRequestProducer(Settings())
    producer._producer, producer.ready = bus, True
    pod = Pod(Settings(), "pod-1", producer=producer, redis=pod_redis)
    pod.listener.subscribed = True
    policy = BatchPolicy(PolicyConfig.defaults("t"))
    batcher = BatcherLoop(
        policy, FakeConsumer(), bus, FakeRedis(), SYSTEM_CLOCK, max_queued=100, metrics=BatcherMetrics()
    )
    engine = SimulatedEngine(max_batch_size=8, batch_time_ms=20)
    worker_metrics = WorkerMetrics("llmq-sim")
    worker = WorkerLoop.build(
        engine,
        bus,
        bus,
        FakeRedis(),
        Settings(worker={"heartbeat_interval_ms": 250}, runtime={"shutdown_grace_s": 1}),
        worker_id="w0",
        partition=0,
        model="llmq-sim",
        max_pending=32,
        metrics=worker_metrics,
    )
    core = worker.core
    router_metrics = RouterMetrics()
    router = ResultRouter(Settings(), FakeConsumer(), bus, FakeRedis(), metrics=router_metrics)
    policy.on_heartbeat(core.heartbeat(SYSTEM_CLOCK.now_ms(), engine.context_window), SYSTEM_CLOCK.now_ms())

    transport = httpx.ASGITransport(app=create_app(pod))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers={"authorization": "Bearer llmq-dev-key"}
    ) as client:
        response = asyncio.create_task(
            client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "abc", "max_tokens": 5})
        )
        await until(lambda: any(r["topic"] == constants.requests_topic("interactive") for r in bus.sent))
        consumed = bus.take(constants.requests_topic("interactive"))
        await batcher.ingest(TopicPartition(consumed["topic"], 0), record(consumed))
        while not any(r["topic"] == constants.TOPIC_BATCHES for r in bus.sent):  # a fixed-time engine's short window
            await asyncio.sleep(0.005)
            await batcher.step()
        batch = bus.take(constants.TOPIC_BATCHES)
        await worker._deliver(await worker._take(record(batch)))
        while not any(r["topic"] == constants.TOPIC_RESULTS for r in bus.sent):
            await worker._deliver(core.on_events(await engine.next_events()))
        for channel, data in worker._redis.published:  # the pod's Redis subscription
            if channel == constants.replies_channel("pod-1"):
                pod.listener.deliver(channel, data)
        await router._handle(record(bus.take(constants.TOPIC_RESULTS)))
        answer = await response
    await engine.close()

    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == "abcab"
    finished = spans.get_finished_spans()
    trace_ids = {s.context.trace_id for s in finished}
    assert len(trace_ids) == 1, [s.name for s in finished]
    names = {s.name for s in finished}
    assert REQUEST_SPANS | {"worker.queue"} <= names
    by_id = {s.context.span_id: s for s in finished}
    (root,) = [s for s in finished if s.parent is None]
    assert root.name == "POST /v1/completions"
    for span in finished:  # one tree: every span's parent is in the trace
        assert span is root or span.parent.span_id in by_id, span.name
    assert by_id[_find(finished, "result_router.route").parent.span_id].name == "worker.publish"
    assert by_id[_find(finished, "worker.request").parent.span_id].name == "batcher.flush"
    assert by_id[_find(finished, "batcher.queue").parent.span_id].name == "kafka.produce"
    # and the metrics moved on the way
    labels = {"traffic_class": "interactive", "model": "llmq-sim"}
    assert batcher.metrics.registry.get_sample_value("llmq_batcher_queue_wait_seconds_count", labels) == 1
    assert (
        worker_metrics.registry.get_sample_value("llmq_worker_requests_total", {**labels, "outcome": "succeeded"}) == 1
    )
    assert router_metrics.registry.get_sample_value("llmq_results_total", {**labels, "outcome": "succeeded"}) == 1
    assert pod.metrics.registry.get_sample_value("llmq_api_responses_total", {**labels, "code": "200"}) == 1


def _find(spans, name):
    (span,) = [s for s in spans if s.name == name]
    return span


async def test_with_tracing_off_nothing_is_recorded_and_no_traceparent_travels():
    tracing.shutdown()
    bus = KafkaBus()
    producer = KafkaRequestProducer(Settings())
    producer._producer, producer.ready = bus, True
    request = generation_request(now_ms=1, instance_id="p")
    await producer.produce(request)
    (sent,) = bus.sent
    assert tracing.header_traceparent(sent["headers"]) is None
    assert wire.decode(sent["value"]).traceparent is None

"""Builders shared by the batcher's unit tests: requests, heartbeats, a policy on a FakeClock and a loop on fakes."""

from __future__ import annotations

from collections import Counter

from aiokafka import TopicPartition

from llmq_batcher.entries import EntryState, EntryTable
from llmq_batcher.loop import BatcherLoop
from llmq_batcher.policy import ENTRY_SLACK_BYTES, BatchPolicy, PolicyConfig
from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.names import Names
from tests.builders import generation_request
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis

MODEL = "llmq-sim"
T0 = 1_700_000_000_000

CLASSES = {  # class key -> (traffic_class, tier)
    "paid": ("interactive", "paid"),
    "free": ("interactive", "free"),
    "near": ("near_interactive", "paid"),
    "deferred": ("deferred", "paid"),
}


def make_policy(**config) -> tuple[BatchPolicy, FakeClock]:
    """A policy and a FakeClock at T0 to tell it the time by; ``config`` overrides PolicyConfig fields."""
    return BatchPolicy(PolicyConfig.defaults("t", **config)), FakeClock(T0)


def req(
    request_id: str,
    cls: str = "paid",
    *,
    tenant: str = "acme",
    model: str = MODEL,
    now_ms: int = T0,
    deadline_in_ms: int = 10_000,
    prompt_tokens: int = 10,
    max_tokens: int = 10,
    prompt: str = "x",
) -> wire.GenerationRequest:
    traffic_class, tier = CLASSES[cls]
    return generation_request(
        request_id,
        now_ms=now_ms,
        deadline_in_ms=deadline_in_ms,
        tenant_id=tenant,
        traffic_class=traffic_class,
        tier=tier,
        model=model,
        prompt=prompt,
        sampling=wire.SamplingParams(max_tokens=max_tokens),
        prompt_tokens=prompt_tokens,
    )


def hb(
    worker_id: str = "w1",
    *,
    free: int = 8,
    max_slots: int = 8,
    model: str = MODEL,
    partition: int | None = None,
    running: int | None = None,
    queued: int = 0,
    fixed_ms: int = 0,
    last_batch_id: str = "",
    est_drain_ms: int = 0,
    now_ms: int = T0,
    preemptible: int = 0,
) -> wire.WorkerHeartbeat:
    """A heartbeat; ``running`` defaults to the busy slots (max_slots - free - queued); ``preemptible``: running
    deferred sequences the worker would preempt."""
    busy = max_slots - free - queued if running is None else running
    return wire.WorkerHeartbeat(
        worker_id=worker_id,
        partition=int(worker_id.lstrip("w") or 0) if partition is None else partition,
        model=model,
        max_slots=max_slots,
        running=busy,
        queued=queued,
        free_slots=free,
        est_drain_ms=est_drain_ms,
        sent_ms=now_ms,
        fixed_batch_time_ms=fixed_ms,
        last_batch_id=last_batch_id,
        preemptible=preemptible,
    )


def dispatched_ids(decision) -> list[list[str]]:
    """Request ids of each batch of a decision."""
    return [[r.request_id for r in batch.requests] for batch in decision.batches]


def entry_bytes(request: wire.GenerationRequest) -> int:
    """What ``request`` counts against a batch's byte budget."""
    return len(wire.encode(request)) + ENTRY_SLACK_BYTES


def recount(table: EntryTable) -> dict[str, object]:
    """The counts an EntryTable keeps, counted again from the entries it holds."""
    dispatched = [e for e in table.held() if e.state is EntryState.DISPATCHED]
    return {
        "queued": sum(e.state is EntryState.QUEUED for e in table.held()),
        "inflight": len(dispatched),
        "live_flights": len({id(e.flight) for e in dispatched}),
        "tenant_inflight": Counter(e.tenant for e in dispatched),
    }


def counts(table: EntryTable, tenants) -> dict[str, object]:
    """The counts ``table`` keeps, in :func:`recount`'s shape (``tenants``: those to ask for)."""
    tenant_inflight = Counter({t: table.tenant_inflight(t) for t in tenants})
    return {
        "queued": table.queued,
        "inflight": table.inflight,
        "live_flights": table.live_flights,
        "tenant_inflight": +tenant_inflight,
    }


NAMES = Names()
INTERACTIVE = TopicPartition(NAMES.request_topics[0], 0)
DEFERRED = TopicPartition(NAMES.deferred_topic, 0)


def make_loop(
    names: Names = NAMES, policy_config: dict | None = None, consumer: FakeConsumer | None = None, **options
) -> tuple[BatcherLoop, FakeConsumer, FakeProducer, FakeRedis]:
    """A BatcherLoop on fakes (``consumer``: by default one assigned an interactive and the deferred partition);
    ``policy_config`` overrides PolicyConfig fields, ``options`` BatcherLoop's."""
    policy, clock = make_policy(**(policy_config or {}))
    consumer = consumer or FakeConsumer(assigned={INTERACTIVE, DEFERRED})
    producer, redis = FakeProducer(), FakeRedis()
    loop = BatcherLoop(policy, consumer, producer, redis, clock, **{"max_queued": 100, "names": names, **options})
    return loop, consumer, producer, redis

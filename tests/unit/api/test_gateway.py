"""Gateway: the waiter exists before the request is produced; produce failures are fast 503s with a Cancel."""

import asyncio

import msgspec
import pytest

from llmq_api.auth import Principal
from llmq_api.errors import ApiError
from llmq_api.gateway import Gateway
from llmq_api.validation import WIRE_FIELDS, ValidRequest, parse_completion
from llmq_api.waiters import WaiterRegistry
from llmq_core import wire
from llmq_core.clock import FakeClock
from tests.unit.api.fakes import CancelRecorder


class Producer:
    ready = True

    def __init__(self, registry: WaiterRegistry, behaviour: str = "ok") -> None:
        self.registry = registry
        self.behaviour = behaviour
        self.seen_registered: list[bool] = []
        self.produced: list[wire.GenerationRequest] = []

    async def run(self) -> None: ...

    async def stop(self) -> None: ...

    async def produce(self, request: wire.GenerationRequest) -> None:
        self.seen_registered.append(request.request_id in self.registry)
        if self.behaviour == "fail":
            raise ConnectionError("broker down")
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        self.produced.append(request)


def a_valid_request() -> ValidRequest:
    return parse_completion(
        b'{"model": "llmq-sim", "prompt": "abc", "max_tokens": 4, "stream": true}', {"llmq-sim": 100}
    )


def make(behaviour="ok", max_waiters=10, accepting=True):
    registry, cancels, clock = WaiterRegistry(max_waiters), CancelRecorder(), FakeClock(1_000_000)
    producer = Producer(registry, behaviour)
    gateway = Gateway(
        instance_id="pod-1",
        registry=registry,
        producer=producer,
        publish_cancel=cancels,
        clock=clock,
        produce_timeout_ms=20,
        accepting=lambda: accepting,
    )
    valid = a_valid_request()
    request = gateway.build(
        valid,
        request_id="cmpl-1",
        principal=Principal(tenant_id="default"),
        traffic_class="near_interactive",
        timeout_ms=5000,
        idempotency_key="idem",
    )
    return gateway, registry, producer, cancels, request


def test_build_fills_the_wire_request():
    _, _, _, _, request = make()
    assert request.reply_to == wire.HttpReply(instance_id="pod-1")
    assert (request.created_ms, request.deadline_ms) == (1_000_000, 1_005_000)
    assert (request.traffic_class, request.tier, request.tenant_id) == ("near_interactive", "paid", "default")
    assert request.prompt == "abc" and request.stream and request.prompt_tokens == 3
    assert request.sampling.max_tokens == 4 and request.idempotency_key == "idem"


def test_a_wire_request_carries_every_field_it_shares_with_the_validated_request():
    shared = set(ValidRequest.__struct_fields__) & set(wire.GenerationRequest.__struct_fields__)
    assert set(WIRE_FIELDS) == shared
    _, _, _, _, request = make()
    valid = a_valid_request()
    assert {name: getattr(request, name) for name in shared} == {name: getattr(valid, name) for name in shared}


async def test_waiter_is_registered_before_producing():
    gateway, registry, producer, cancels, request = make()
    waiter = await gateway.submit(request)
    assert producer.seen_registered == [True] and producer.produced == [request]
    assert "cmpl-1" in registry and waiter.stream and cancels.cancels == []


@pytest.mark.parametrize("behaviour", ["fail", "hang"])
async def test_produce_failure_is_a_503_with_retry_after_and_a_cancel(behaviour):
    gateway, registry, _, cancels, request = make(behaviour)
    with pytest.raises(ApiError) as info:
        await gateway.submit(request)
    assert info.value.status == 503 and info.value.headers["retry-after"] == "1"
    assert len(registry) == 0
    assert cancels.cancels == [("cmpl-1", "produce_failed")]


async def test_draining_pod_refuses_before_registering():
    gateway, registry, producer, _, request = make(accepting=False)
    with pytest.raises(ApiError) as info:
        await gateway.submit(request)
    assert info.value.status == 503 and len(registry) == 0 and producer.seen_registered == []


async def test_full_pod_answers_429():
    gateway, registry, _, _, request = make(max_waiters=1)
    registry.register("other", stream=False)
    with pytest.raises(ApiError) as info:
        await gateway.submit(request)
    assert info.value.status == 429 and "retry-after" in info.value.headers


async def test_cancelled_submit_resolves_waiter_and_cancels():
    gateway, registry, _, cancels, request = make("hang")
    gateway.produce_timeout_s = 60
    task = asyncio.create_task(gateway.submit(request))
    await asyncio.sleep(0.01)
    waiter_seen = "cmpl-1" in registry
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert waiter_seen and task.cancelled() and len(registry) == 0
    assert cancels.cancels == [("cmpl-1", "produce_failed")]


async def test_a_failing_kafka_opens_the_breaker_and_later_requests_get_503_at_once():
    gateway, registry, producer, cancels, request = make("fail")
    clock = gateway.clock
    with pytest.raises(ApiError):
        await gateway.submit(request)  # the first one learns that producing fails
    assert gateway.breaker.state == "open" and gateway.breaker.dependency.state == "down"
    for advance_ms in (0, 999):
        clock.advance(advance_ms)
        with pytest.raises(ApiError) as info:
            await gateway.submit(msgspec.structs.replace(request, request_id="cmpl-2"))
        assert (info.value.status, info.value.code) == (503, "kafka_unavailable")
        assert info.value.headers["retry-after"] == "1"
    assert producer.seen_registered == [True] and len(registry) == 0  # refused before registering or producing
    assert cancels.cancels == [("cmpl-1", "produce_failed")]


async def test_the_breaker_probes_after_its_backoff_and_closes_when_kafka_answers():
    gateway, _, producer, _, request = make("fail")
    await asyncio.gather(gateway.submit(request), return_exceptions=True)
    gateway.clock.advance(1000)
    producer.behaviour = "ok"  # the broker is back
    probe = msgspec.structs.replace(request, request_id="cmpl-probe")
    await gateway.submit(probe)
    assert producer.produced == [probe] and gateway.breaker.state == "closed"
    await gateway.submit(msgspec.structs.replace(request, request_id="cmpl-3"))
    assert len(producer.produced) == 2


async def test_a_canceled_submit_is_not_a_kafka_failure():
    gateway, _, _, _, request = make("hang")
    gateway.produce_timeout_s = 60
    task = asyncio.create_task(gateway.submit(request))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gateway.breaker.state == "closed"

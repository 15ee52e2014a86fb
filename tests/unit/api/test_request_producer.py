"""KafkaRequestProducer replaces a producer whose sender died (aiokafka fails every later send the same way), and
tells the circuit breaker what it sees of the broker."""

import asyncio

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

import llmq_api.pod as pod_module
from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from llmq_api.health import CircuitBreaker, Dependency
from llmq_api.pod import KafkaRequestProducer

REQUEST = wire.GenerationRequest(request_id="r1", model="llmq-sim", prompt="hi", created_ms=0, deadline_ms=1,
                                 reply_to=wire.HttpReply(instance_id="pod"))


class FakeClient:
    """aiokafka's client as the health check sees it: whether a metadata request reaches a broker."""

    def __init__(self) -> None:
        self.reachable = True
        self.checks = 0

    async def force_metadata_update(self) -> bool:
        self.checks += 1
        return self.reachable


class FakeProducer:
    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.sent: list[bytes] = []
        self.stopped = False
        self.client = FakeClient()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        if self.broken:
            raise OutOfOrderSequenceNumber()
        self.sent.append(value)


async def test_a_producer_that_broke_for_good_is_replaced_and_sending_works_again(monkeypatch):
    made = [FakeProducer(broken=True), FakeProducer(broken=False)]
    pending = list(made)  # make_producer hands these out in order
    monkeypatch.setattr(pod_module.kafka, "make_producer", lambda settings: pending.pop(0))
    producer = KafkaRequestProducer(Settings())
    runner = asyncio.create_task(producer.run())
    try:
        await asyncio.sleep(0)
        assert producer.ready
        with pytest.raises(OutOfOrderSequenceNumber):
            await producer.produce(REQUEST)
        async with asyncio.timeout(1):
            while not (producer.ready and made[0].stopped):
                await asyncio.sleep(0.01)
        await producer.produce(REQUEST)
        assert len(made[1].sent) == 1
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def eventually(condition) -> None:
    async with asyncio.timeout(2):
        while not condition():
            await asyncio.sleep(0.005)


async def test_the_health_check_opens_the_breaker_and_an_idle_pod_closes_it_again(monkeypatch):
    fake = FakeProducer()
    monkeypatch.setattr(pod_module.kafka, "make_producer", lambda settings: fake)
    clock = FakeClock()
    breaker = CircuitBreaker(Dependency("kafka", clock), clock, backoff_ms=1000, max_backoff_ms=1000,
                             probe_timeout_ms=2000)
    producer = KafkaRequestProducer(Settings(api_kafka_check_interval_ms=1), breaker)
    runner = asyncio.create_task(producer.run())
    try:
        await eventually(lambda: breaker.dependency.state == "up")  # the producer started
        fake.client.reachable = False  # the broker went away: no request has failed yet
        await eventually(lambda: breaker.state == "open")
        assert breaker.dependency.reason == "the Kafka client reaches no broker"
        checks = fake.client.checks
        await eventually(lambda: fake.client.checks == checks)  # no checks while the backoff runs
        fake.client.reachable = True
        await asyncio.sleep(0.02)
        assert breaker.state == "open" and fake.client.checks == checks
        clock.advance(1000)  # past the backoff the check is the probe, with no request in sight
        await eventually(lambda: breaker.state == "closed" and breaker.dependency.state == "up")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

"""KafkaRequestProducer keeps producing after its producer broke (aiokafka fails every later send the same way): the
shared kafka.RenewableProducer replaces it. It also tells the circuit breaker what it sees of the broker."""

import asyncio

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

from llmq_api.health import CircuitBreaker, Dependency
from llmq_api.pod import KafkaRequestProducer
from llmq_core import kafka
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from tests.builders import generation_request
from tests.unit.core.kafka_fakes import FakeKafkaProducer

REQUEST = generation_request(prompt="hi", instance_id="pod")


async def eventually(condition) -> None:
    """Wait until ``condition()`` holds; the bound only stops a hang (a loaded 2-core machine needed more than 2 s)."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_producer_that_broke_for_good_is_replaced_and_sending_works_again(monkeypatch):
    made = [
        FakeKafkaProducer(start_error=ConnectionError("no broker yet")),
        FakeKafkaProducer(send_errors=[OutOfOrderSequenceNumber()]),
        FakeKafkaProducer(),
    ]
    pending = list(made)  # make_producer hands these out in order
    monkeypatch.setattr(kafka, "make_producer", lambda settings: pending.pop(0))
    monkeypatch.setattr("llmq_api.pod.RETRY_CONNECT_S", 0)
    producer = KafkaRequestProducer(Settings())
    with pytest.raises(ConnectionError):  # not started yet
        await producer.produce(REQUEST)
    runner = asyncio.create_task(producer.run())  # the first start fails, the second succeeds
    await eventually(lambda: producer.ready)
    assert producer.ready
    await producer.produce(REQUEST)  # the broken producer never sent it: its replacement does, once
    assert producer.ready and len(made[1].sent) == 0 and len(made[2].sent) == 1
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    await producer.stop()
    assert made[1].stopped and made[2].stopped


async def test_the_health_check_opens_the_breaker_and_closes_it_as_soon_as_the_broker_is_back(monkeypatch):
    fake = FakeKafkaProducer()
    monkeypatch.setattr(kafka, "make_producer", lambda settings: fake)
    clock = FakeClock()
    breaker = CircuitBreaker(
        Dependency("kafka", clock), clock, backoff_ms=1000, max_backoff_ms=1000, probe_timeout_ms=2000
    )
    producer = KafkaRequestProducer(Settings(api_kafka_check_interval_ms=1), breaker)
    runner = asyncio.create_task(producer.run())
    try:
        await eventually(lambda: breaker.dependency.state == "up")  # the producer started
        fake.client.reachable = False  # the broker went away: no request has failed yet
        await eventually(lambda: breaker.state == "open")
        assert breaker.dependency.reason == "the Kafka client reaches no broker"
        assert not breaker.allow()  # requests get their 503 at once while the backoff runs
        fake.client.reachable = True  # the broker is back: the next check closes it, the backoff not waited out
        await eventually(lambda: breaker.state == "closed" and breaker.dependency.state == "up")
        assert breaker.allow()
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

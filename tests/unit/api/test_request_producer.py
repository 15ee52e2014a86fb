"""KafkaRequestProducer keeps producing after its producer broke (aiokafka fails every later send the same way): the
shared kafka.RenewableProducer replaces it. It also tells the circuit breaker what it sees of the broker."""

import asyncio

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

from llmq_api.health import CircuitBreaker, Dependency
from llmq_api.pod import RETRY_CONNECT_S, KafkaRequestProducer
from llmq_core import kafka
from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from tests.builders import generation_request
from tests.unit.core.kafka_fakes import FakeKafkaProducer

REQUEST = generation_request(prompt="hi", instance_id="pod")


class Steps:
    """The producer's injected sleep: each call waits until the test lets one go (no real time passes)."""

    def __init__(self) -> None:
        self.sleeping: asyncio.Queue[float] = asyncio.Queue()
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        self.sleeping.put_nowait(seconds)
        await self._go.get()

    async def asleep(self) -> float:
        """Wait (bounded only against a hang) until the producer sleeps; the seconds it asked for."""
        async with asyncio.timeout(10):
            return await self.sleeping.get()

    def release(self) -> None:
        """Let the sleeping producer go on."""
        self._go.put_nowait(None)

    async def step(self) -> None:
        """Let the sleeping producer go on, and wait until it sleeps again."""
        self.release()
        await self.asleep()


async def test_a_producer_that_broke_for_good_is_replaced_and_sending_works_again(monkeypatch):
    made = [
        FakeKafkaProducer(start_error=ConnectionError("no broker yet")),
        FakeKafkaProducer(send_errors=[OutOfOrderSequenceNumber()]),
        FakeKafkaProducer(),
    ]
    pending = list(made)  # make_producer hands these out in order
    monkeypatch.setattr(kafka, "make_producer", lambda settings, **options: pending.pop(0))
    steps = Steps()
    producer = KafkaRequestProducer(Settings(), sleep=steps.sleep)
    with pytest.raises(ConnectionError):  # not started yet
        await producer.produce(REQUEST)
    runner = asyncio.create_task(producer.run())  # the first start fails, the second succeeds
    assert await steps.asleep() == RETRY_CONNECT_S and not producer.ready
    steps.release()
    await asyncio.wait_for(runner, 10)  # without a breaker to report to, run() ends once started (bound: a hang)
    await producer.produce(REQUEST)  # the broken producer never sent it: its replacement does, once
    assert producer.ready and len(made[1].sent) == 0 and len(made[2].sent) == 1
    await producer.stop()
    assert made[1].stopped and made[2].stopped


def checked_producer(monkeypatch):
    """A running KafkaRequestProducer over a fake client, checking the broker every 250 ms of its stepped sleep:
    (fake producer, breaker, steps, producer, its run task)."""
    fake = FakeKafkaProducer()
    monkeypatch.setattr(kafka, "make_producer", lambda settings, **options: fake)
    clock = FakeClock()
    breaker = CircuitBreaker(
        Dependency("kafka", clock), clock, backoff_ms=1000, max_backoff_ms=1000, probe_timeout_ms=2000
    )
    steps = Steps()
    producer = KafkaRequestProducer(Settings(api={"kafka_check_interval_ms": 250}), breaker, sleep=steps.sleep)
    runner = asyncio.create_task(producer.run())
    return fake, breaker, steps, producer, runner


async def test_the_health_check_opens_the_breaker_and_closes_it_as_soon_as_the_broker_is_back(monkeypatch):
    fake, breaker, steps, producer, runner = checked_producer(monkeypatch)
    try:
        assert await steps.asleep() == 0.25  # started; it waits one interval before its first check
        assert breaker.dependency.state == "up"
        fake.client.reachable = False  # the broker went away: no request has failed yet
        await steps.step()
        assert breaker.state == "open" and breaker.dependency.reason == "the Kafka client reaches no broker"
        assert not breaker.allow()  # requests get their 503 at once while the backoff runs
        fake.client.reachable = True  # the broker is back: the next check closes it, the backoff not waited out
        await steps.step()
        assert breaker.state == "closed" and breaker.dependency.state == "up"
        assert breaker.allow() and fake.client.checks == 2
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_no_health_check_while_requests_are_acked(monkeypatch):
    fake, breaker, steps, producer, runner = checked_producer(monkeypatch)
    try:
        await steps.asleep()
        await producer.produce(REQUEST)  # acked within the interval: it proved the broker reachable
        await steps.step()
        assert fake.client.checks == 0
        await steps.step()  # a quiet interval: the client is asked again
        assert fake.client.checks == 1
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

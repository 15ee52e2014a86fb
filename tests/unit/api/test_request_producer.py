"""KafkaRequestProducer replaces a producer whose sender died (aiokafka fails every later send the same way)."""

import asyncio

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

import llmq_api.pod as pod_module
from llmq_core import wire
from llmq_core.settings import Settings
from llmq_api.pod import KafkaRequestProducer

REQUEST = wire.GenerationRequest(request_id="r1", model="llmq-sim", prompt="hi", created_ms=0, deadline_ms=1,
                                 reply_to=wire.HttpReply(instance_id="pod"))


class FakeProducer:
    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.sent: list[bytes] = []
        self.stopped = False

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

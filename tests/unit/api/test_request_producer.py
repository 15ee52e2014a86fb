"""KafkaRequestProducer keeps producing after its producer broke (aiokafka fails every later send the same way): the
shared kafka.RenewableProducer replaces it."""

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

from llmq_core import kafka, wire
from llmq_core.settings import Settings
from llmq_api.pod import KafkaRequestProducer

from tests.unit.core.kafka_fakes import FakeKafkaProducer

REQUEST = wire.GenerationRequest(request_id="r1", model="llmq-sim", prompt="hi", created_ms=0, deadline_ms=1,
                                 reply_to=wire.HttpReply(instance_id="pod"))


async def test_a_producer_that_broke_for_good_is_replaced_and_sending_works_again(monkeypatch):
    made = [FakeKafkaProducer(start_error=ConnectionError("no broker yet")),
            FakeKafkaProducer(send_errors=[OutOfOrderSequenceNumber()]), FakeKafkaProducer()]
    pending = list(made)  # make_producer hands these out in order
    monkeypatch.setattr(kafka, "make_producer", lambda settings: pending.pop(0))
    monkeypatch.setattr("llmq_api.pod.RETRY_CONNECT_S", 0)
    producer = KafkaRequestProducer(Settings())
    with pytest.raises(ConnectionError):  # not started yet
        await producer.produce(REQUEST)
    await producer.run()  # the first start fails, the second succeeds
    assert producer.ready
    with pytest.raises(OutOfOrderSequenceNumber):
        await producer.produce(REQUEST)
    await producer.produce(REQUEST)
    assert producer.ready and len(made[2].sent) == 1
    await producer.stop()
    assert made[1].stopped and made[2].stopped

"""One record never takes its fetch down (QA finding 1): whatever raises while the batcher takes one record in (decode,
the checks, sizing in policy.add) dead-letters that record with its reason and settles it; its neighbours are queued and
the commit position moves past it. A failure that cannot be dead-lettered (the broker is down) seeks the fetch back so
nothing fetched with it is dropped."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaTimeoutError

from llmq_core import constants, wire
from tests.fakes import FakeConsumer, Record
from tests.unit.batcher.helpers import INTERACTIVE, NAMES, make_loop, req

HUGE = (
    '{"type":"generation_request","request_id":"big","created_ms":1,"deadline_ms":2,"model":"llmq-sim",'
    '"reply_to":{"kind":"http","instance_id":"api-0"},"attempt":18446744073709551616}'
)


def errors(producer) -> list[str]:
    return [dict(d["headers"])[constants.HEADER_ERROR].decode() for d in producer.on(NAMES.dead_letters_topic)]


async def test_a_record_that_raises_after_decoding_costs_only_itself(batcher, monkeypatch):
    loop, consumer, producer, _ = batcher
    add = loop.policy.add

    def exploding_add(request, now_ms):
        if request.request_id == "bad":
            raise OverflowError("can't serialize ints > 2**64 - 1")
        return add(request, now_ms)

    monkeypatch.setattr(loop.policy, "add", exploding_add)
    for offset, request_id in enumerate(["a", "bad", "b"]):
        await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(req(request_id)), key=b"k"))
    assert errors(producer) == ["OverflowError: can't serialize ints > 2**64 - 1"]
    assert loop.policy.holds("a") and loop.policy.holds("b")
    await loop.step()  # no worker yet: a and b stay queued, so the commit stops at a, not at the poison
    assert consumer.commits == [] or consumer.commits[-1][INTERACTIVE] == 0
    loop.offsets.settle(INTERACTIVE, 0)
    loop.offsets.settle(INTERACTIVE, 2)
    await loop.step(drain=True)
    assert consumer.commits[-1] == {INTERACTIVE: 3}


async def test_an_integer_past_int64_is_dead_lettered_by_the_decoder(batcher):
    loop, _, producer, _ = batcher
    await loop.ingest(INTERACTIVE, Record(offset=0, value=HUGE.encode()))
    await loop.ingest(INTERACTIVE, Record(offset=1, value=wire.encode(req("ok"))))
    (reason,) = errors(producer)
    assert "$.attempt" in reason and loop.policy.holds("ok")


async def test_a_record_that_cannot_even_be_dead_lettered_seeks_its_fetch_back():
    other = type(INTERACTIVE)(INTERACTIVE.topic, 1)
    fetched = {
        INTERACTIVE: [Record(offset=5, value=wire.encode(req("a"))), Record(offset=6, value=b"\xc1")],
        other: [Record(offset=9, value=wire.encode(req("b")), partition=1)],
    }
    loop, consumer, producer, _ = make_loop(consumer=FakeConsumer(fetched))
    producer.failing = True  # the dead letter of offset 6 cannot be produced
    with pytest.raises(KafkaTimeoutError):
        await loop.intake.consume()
    assert consumer.seeks == [(INTERACTIVE, 6), (other, 9)]
    assert loop.offsets.committable(INTERACTIVE) == 5 and loop.offsets.committable(other) is None

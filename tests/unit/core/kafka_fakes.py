"""A stand-in for AIOKafkaProducer: records what it accepted, fails as told, the way aiokafka fails."""

from __future__ import annotations

import asyncio

from aiokafka.errors import OutOfOrderSequenceNumber

from llmq_core.kafka import RECORD_REFUSED_ERRORS


class FakeClient:
    """aiokafka's client as a health check sees it: whether a metadata request reaches a broker."""

    def __init__(self) -> None:
        self.reachable = True
        self.checks = 0

    async def force_metadata_update(self) -> bool:
        self.checks += 1
        return self.reachable


class FakeKafkaProducer:
    """``ack_errors``: raised by the acks of the next sends, in order (the broker's answer; a refusal breaks the
    producer as aiokafka's does: every later send raises OutOfOrderSequenceNumber); ``send_errors``: raised by the next
    calls of ``send`` itself (before the record is queued); ``start_error``: raised by ``start``."""

    def __init__(self, *, ack_errors=(), send_errors=(), start_error: Exception | None = None) -> None:
        self.ack_errors, self.send_errors = list(ack_errors), list(send_errors)
        self.start_error = start_error
        self.broken = False
        self.sent: list[tuple[str, bytes]] = []
        self.started = self.stopped = False
        self.client = FakeClient()

    async def start(self) -> None:
        if self.start_error is not None:
            raise self.start_error
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None, headers=None):
        if self.broken:
            raise OutOfOrderSequenceNumber()
        if self.send_errors:
            raise self.send_errors.pop(0)
        ack = asyncio.get_running_loop().create_future()
        if self.ack_errors:
            error = self.ack_errors.pop(0)
            ack.set_exception(error)
            self.broken = isinstance(error, RECORD_REFUSED_ERRORS)  # the sequence gap: the next record kills the sender
        else:
            self.sent.append((topic, value))
            ack.set_result(len(self.sent) - 1)
        return ack

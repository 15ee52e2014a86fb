"""Publishing what the worker core wrote: results to llmq.results (durable), then stream marks, progress frames,
stream logs and replies to Redis (best effort).

Produce first: a result the broker refuses is replaced by its errored stand-in before any waiter sees it, so the
caller's answer is always the durable outcome (DESIGN invariant 1). The cost is one produce ack on the answer's path
(docs/limits.md).
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from llmq_core import tracing, wire
from llmq_core.constants import progress_key, stream_log_key, streamed_key
from llmq_core.kafka import RECORD_REFUSED_ERRORS, RECORD_TOO_LARGE_ERRORS, headers
from llmq_core.names import Names
from llmq_core.status import ErrorCode
from llmq_core.telemetry import request_fields
from llmq_worker.answers import refused_result
from llmq_worker.core import Outbox
from llmq_worker.spans import Publishing, RequestSpans

log = logging.getLogger(__name__)

PRODUCE_ATTEMPTS = 4  # tries of one result record on transient errors (each bounded by the producer's own timeout)
PRODUCE_BACKOFF_S = 0.2  # before retry k: PRODUCE_BACKOFF_S * 2**k


class ResultPublisher:
    """Sends an :class:`~llmq_worker.core.Outbox` to ``names.results_topic`` and Redis; traces it while tracing is on
    (``spans``: the worker's, which saw its requests taken)."""

    def __init__(self, producer: AIOKafkaProducer, redis, names: Names, spans: RequestSpans) -> None:
        self._producer = producer
        self._redis = redis
        self._names = names
        self._spans = spans

    async def publish(self, out: Outbox) -> list[wire.FinalResult]:
        """Produce ``out``'s results, then publish its marks and replies (a FinalResult reply as produced). Returns
        what llmq.results got, in ``out.results`` order. Raises KafkaError when a result could not be produced after
        PRODUCE_ATTEMPTS; a failed Redis publish is logged (llmq.results carries every result)."""
        traced = self._spans.publishing(out.results) if tracing.enabled() and out.results else None
        produced = await asyncio.gather(*(self._produce_result(r, traced) for r in out.results))
        stand_ins = {r.request_id: r for r, original in zip(produced, out.results, strict=True) if r is not original}
        if out.replies or out.redis_writes:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for request_id, mark, ttl_ms in out.marks:  # before its chunk: a mark never trails what was sent
                        pipe.set(streamed_key(request_id), wire.encode(mark), px=ttl_ms)
                    for request_id, frame, ttl_ms in out.progress:  # likewise: a continuation holds what was sent
                        pipe.rpush(progress_key(request_id), wire.encode(frame))
                        if ttl_ms is not None:
                            pipe.pexpire(progress_key(request_id), ttl_ms)
                    for request_id, data, ttl_ms in out.stream_log:  # a resume replays at least what was sent
                        pipe.rpush(stream_log_key(request_id), data)
                        if ttl_ms is not None:
                            pipe.pexpire(stream_log_key(request_id), ttl_ms)
                    if out.forget:  # their results are produced: no worker will continue them
                        pipe.delete(*(progress_key(request_id) for request_id in out.forget))
                    for channel, message in out.replies:
                        if isinstance(message, wire.FinalResult):
                            message = stand_ins.get(message.request_id, message)
                        pipe.publish(channel, wire.encode(message))
                    await pipe.execute()
            except Exception:  # noqa: BLE001 - llmq.results carries every result (the router stores it for the pod)
                log.exception("publishing %d replies failed", len(out.replies))
        if traced is not None:
            traced.end()
        return produced

    async def _produce_result(self, result: wire.FinalResult, traced: Publishing | None) -> wire.FinalResult:
        """Produce ``result``; returns what llmq.results got: ``result``, or its errored stand-in when the broker refuses
        the record for good (the worker keeps serving: one result never ends it)."""
        try:
            await self._send_result(result, traced)
            return result
        except RECORD_REFUSED_ERRORS as exc:
            code = ErrorCode.RESULT_TOO_LARGE if isinstance(exc, RECORD_TOO_LARGE_ERRORS) else ErrorCode.RESULT_REFUSED
            log.error(
                "%s refused the result (%r): answering errored %s",
                self._names.results_topic,
                exc,
                code,
                extra=request_fields(result.request_id),
            )
            stand_in = refused_result(result, code, f"{self._names.results_topic} refused the result: {exc!r}"[:512])
            await self._send_result(stand_in, traced)
            return stand_in

    async def _send_result(self, result: wire.FinalResult, traced: Publishing | None) -> None:
        """One record, retried with backoff on transient errors; after PRODUCE_ATTEMPTS the error ends the worker (the
        broker is gone, not this result: its batch is redelivered to the next worker)."""
        value = wire.encode(result)
        record_headers = headers() if traced is None else traced.headers(result.request_id)
        for attempt in range(PRODUCE_ATTEMPTS):
            try:
                ack = await self._producer.send(
                    self._names.results_topic, value, key=result.request_id.encode(), headers=record_headers
                )
                await ack
                return
            except RECORD_REFUSED_ERRORS:
                raise
            except KafkaError as exc:
                if attempt + 1 == PRODUCE_ATTEMPTS:
                    raise
                log.warning(
                    "producing a result failed (%r): retry %d",
                    exc,
                    attempt + 1,
                    extra=request_fields(result.request_id),
                )
                await asyncio.sleep(PRODUCE_BACKOFF_S * 2**attempt)

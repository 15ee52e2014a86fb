"""The batcher's outputs of a decision: produce its batches to llmq.batches and its answers to llmq.results (and to
the pods' reply channels), settling what went out. What a failed batch produce means is a pure decision,
:func:`on_produce_error`: a refused record is never put back in front."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter

import msgspec
from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerClosed
from redis.asyncio import Redis
from redis.exceptions import RedisError

from llmq_batcher.capacity import CLAIM_RETRY_MS
from llmq_batcher.outcomes import final_result
from llmq_batcher.policy import Answer, BatchDispatch, Decision
from llmq_batcher.shared import Shared
from llmq_core import constants, continuation, kafka, progress, tracing, wire
from llmq_core.status import ErrorCode, ErrorType, outcome_label
from llmq_core.telemetry import request_fields

log = logging.getLogger(__name__)

PRODUCE_RETRY_BASE_MS = 100  # first hold of a model after a transient produce failure; doubles per failure in a row
PRODUCE_RETRY_MAX_MS = 5000
_TOO_LARGE = kafka.RECORD_TOO_LARGE_ERRORS
# Not marked retriable by aiokafka, yet none of them is the record's fault (a broker outage raises the first two; the
# producer replaces itself after the others, see kafka.RenewableProducer).
_TRANSIENT = (KafkaTimeoutError, ProducerClosed, *kafka.BROKEN_PRODUCER_ERRORS)


def is_permanent(exc: BaseException) -> bool:
    """Whether producing the same record again cannot succeed (aiokafka marks it non-retriable)."""
    return isinstance(exc, KafkaError) and not exc.retriable and not isinstance(exc, _TRANSIENT)


def retry_delay_ms(failures: int) -> int:
    """Hold after ``failures`` transient produce failures in a row (>= 1): exponential, capped."""
    return min(PRODUCE_RETRY_BASE_MS << min(failures - 1, 16), PRODUCE_RETRY_MAX_MS)


class Retry(msgspec.Struct, frozen=True):
    """A transient failure: hold the batch's model ``delay_ms``, then dispatch its requests again."""

    delay_ms: int


class Split(msgspec.Struct, frozen=True):
    """The broker refused the batch as too large: bisect it, its parts go out one after the other."""


class Fail(msgspec.Struct, frozen=True):
    """Refused for good: answer the batch's requests errored (``error_type``, ``message``, ``code``)."""

    error_type: str
    message: str
    code: str


def on_produce_error(exc: BaseException, batch: BatchDispatch, failures: int) -> Retry | Split | Fail:
    """What to do about ``batch`` after producing it raised ``exc``; ``failures``: its model's transient produce
    failures in a row before this one. A lone request too large for a record is answered, not split."""
    if not is_permanent(exc):
        return Retry(retry_delay_ms(failures + 1))
    if isinstance(exc, _TOO_LARGE) and len(batch.requests) > 1:
        return Split()
    if isinstance(exc, _TOO_LARGE):
        return Fail(
            ErrorType.INVALID_REQUEST,
            f"The request does not fit in one record of the batch topic: {exc}",
            ErrorCode.REQUEST_TOO_LARGE,
        )
    return Fail(ErrorType.SERVER, f"The batch topic refused the request: {exc}", ErrorCode.DISPATCH_FAILED)


class Dispatcher:
    """Carries a Decision out; every produced batch or answer settles its requests' records."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._failures: Counter[str] = Counter()  # model -> transient batch produce failures in a row

    async def act(self, decision: Decision) -> list[BatchDispatch]:
        """Produce ``decision``'s batches and answers, forget its dropped requests; returns the batches that went out
        (a part of a batch split for its size counts as one)."""
        shared = self.shared
        sent = [b for out in await gather(self._send_batch(b) for b in decision.batches) for b in out]
        if decision.answers:
            results = [final_result(answer, shared.clock.now_ms()) for answer in decision.answers]
            await publish_replies(shared.redis, results)
            await gather(self._send_answer(a, r) for a, r in zip(decision.answers, results))
        for request_id in decision.dropped:
            shared.held.settle(request_id)
            if tracing.enabled():
                shared.spans.dropped(request_id)
        return sent

    async def _send_batch(self, batch: BatchDispatch) -> list[BatchDispatch]:
        """Produce ``batch`` (what the fleet's ledger granted of it); returns the batches that went out (its parts, when
        the broker refused it as too large)."""
        shared = self.shared
        batch = await self._claimed(batch)
        if batch is None:
            return []
        batch = await self._continued(batch)
        message, flushes = batch.to_wire(), []
        if tracing.enabled():
            message, flushes = shared.spans.flush(message, batch.partition)
        try:
            await kafka.send_message(
                shared.producer, shared.names.batches_topic, message, key=batch.batch_id, partition=batch.partition
            )
        except Exception as exc:
            return await self._produce_failed(batch, exc)
        finally:
            for span in flushes:
                span.end()
        self._failures.pop(batch.model, None)
        if shared.metrics is not None:
            shared.metrics.dispatched(
                batch.model,
                batch.flush_reason,
                batch.requests,
                shared.clock.now_ms(),
                shared.policy.config.model_max_batch.get(batch.model),
                batch.route,
                batch.preempting,
            )
        for request in batch.requests:
            shared.held.settle(request.request_id)
        return [batch]

    async def _claimed(self, batch: BatchDispatch) -> BatchDispatch | None:
        """``batch`` as far as its worker's ledger granted it (None: nothing); what was not granted is queued again for
        the next round. A failed claim holds the model CLAIM_RETRY_MS."""
        shared = self.shared
        if shared.capacity is None:
            return batch
        now_ms = shared.clock.now_ms()
        try:
            grant = await shared.capacity.claim(batch, now_ms)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("claiming capacity for a batch failed, holding it %d ms: %r", CLAIM_RETRY_MS, exc)
            shared.policy.claim_failed(batch, now_ms, CLAIM_RETRY_MS)
            grant = None
        if shared.metrics is not None:
            shared.metrics.claimed(batch.model, len(batch.requests), None if grant is None else grant.granted)
        kept = None if grant is None else shared.policy.claimed(batch, grant)
        if kept is not batch:
            shared.wake.set()  # what was not granted goes out in a later round
        return kept

    async def _continued(self, batch: BatchDispatch) -> BatchDispatch:
        """``batch`` with each re-dispatched request carrying what its earlier attempts generated (read from their
        progress frames: :func:`llmq_core.continuation.continued`). Progress that cannot be read leaves the requests
        to run from their start (a stream that reached its caller then ends ``stream_interrupted``)."""
        retried = [r.request_id for r in batch.requests if r.attempt > 0]
        if not retried:
            return batch
        try:
            frames = await progress.read(self.shared.redis, retried)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("reading the progress of %d re-dispatched requests failed: %r", len(retried), exc)
            frames = {}
        max_hops = self.shared.policy.config.max_continuations
        requests = [
            continuation.continued(r, frames.get(r.request_id, ()), max_hops) if r.attempt > 0 else r
            for r in batch.requests
        ]
        if self.shared.metrics is not None:
            self.shared.metrics.redispatched(batch.model, [r for r in requests if r.attempt > 0])
        return dataclasses.replace(batch, requests=requests)

    async def _produce_failed(self, batch: BatchDispatch, exc: Exception) -> list[BatchDispatch]:
        """Carry :func:`on_produce_error` out; returns the parts of a split batch that went out."""
        policy, now_ms, extra = self.shared.policy, self.shared.clock.now_ms(), {"batch_id": batch.batch_id}
        self.shared.wake.set()  # answers and re-queued requests are for the next round
        plan = on_produce_error(exc, batch, self._failures[batch.model])
        if isinstance(plan, Retry):
            self._failures[batch.model] += 1
            log.error("producing batch failed, re-queueing in %d ms: %r", plan.delay_ms, exc, extra=extra)
            policy.undispatch(batch, now_ms, retry_in_ms=plan.delay_ms)
            return []
        if isinstance(plan, Split):
            log.warning("batch of %d refused as too large, splitting: %r", len(batch.requests), exc, extra=extra)
            sent = []
            for part in policy.split(batch, now_ms):
                sent += await self._send_batch(part)
            return sent
        log.error("batch refused for good, answering its %d requests: %r", len(batch.requests), exc, extra=extra)
        policy.fail(batch, plan.error_type, plan.message, plan.code)
        return []

    async def _send_answer(self, answer: Answer, result: wire.FinalResult) -> None:
        shared = self.shared
        outcome = outcome_label(answer.outcome, answer.error_type)
        traceparent = shared.spans.answered(result.request_id, outcome) if tracing.enabled() else None
        try:
            await kafka.send_message(
                shared.producer, shared.names.results_topic, result, key=result.request_id, traceparent=traceparent
            )
        except Exception as exc:  # left unsettled: the request is redelivered after a restart and answered again
            log.error(
                "answering %s failed: %s",
                result.outcome.value,
                exc,
                extra=request_fields(result.request_id, traceparent or answer.request.traceparent),
            )
            return
        if shared.metrics is not None:
            shared.metrics.answered_request(answer.request, outcome)
        shared.held.settle(result.request_id)


async def publish_replies(redis: Redis, results: list[wire.FinalResult]) -> None:
    """Answers of HTTP requests to their pods' channels, in one pipeline (many at once must not each take a pooled
    connection). Best effort: every answer also goes to llmq.results, whose stored copy a resubscribing pod reads."""
    replies = [
        (constants.replies_channel(r.reply_to.instance_id), wire.encode(r))
        for r in results
        if isinstance(r.reply_to, wire.HttpReply)
    ]
    if not replies:
        return
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for channel, payload in replies:
                pipe.publish(channel, payload)
            await pipe.execute()
    except Exception as exc:
        log.warning("publishing %d answers failed: %s", len(replies), exc)


async def gather(coroutines) -> list:
    """Await ``coroutines`` together, as ``asyncio.gather``; one alone is awaited in place (most rounds send one batch
    and answer nothing: gather would wrap it in a task)."""
    coroutines = list(coroutines)
    if len(coroutines) == 1:
        return [await coroutines[0]]
    return await asyncio.gather(*coroutines) if coroutines else []

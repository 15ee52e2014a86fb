"""From a validated request to a produced GenerationRequest with its waiter registered first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from llmq_api.admission import retry_after_s, too_many_requests
from llmq_api.auth import Principal
from llmq_api.errors import RETRY_AFTER_S, unavailable
from llmq_api.exchange import CancelPublisher
from llmq_api.health import KAFKA, CircuitBreaker, Dependency
from llmq_api.validation import ValidRequest
from llmq_api.waiters import Abandoned, Waiter, WaiterRegistry
from llmq_core import wire
from llmq_core.clock import Clock

log = logging.getLogger(__name__)

PRODUCE_FAILED_REASON = "produce_failed"
KAFKA_UNAVAILABLE = "kafka_unavailable"  # the error code of a request refused while the breaker is open


class RequestProducer(Protocol):
    ready: bool  # True once it can produce

    async def run(self) -> None:
        """Connect (retrying as needed) and return once ready, or run until cancelled."""
        ...

    async def produce(self, request: wire.GenerationRequest) -> None:
        """Write ``request`` to its traffic class's topic and wait for the broker's ack; raises on failure."""
        ...

    async def stop(self) -> None: ...


@dataclass(eq=False, repr=False, kw_only=True)
class Gateway:
    """Builds GenerationRequests for this pod and submits them: register the waiter, then produce (bounded).

    ``accepting()`` says whether the pod takes new work now; ``breaker`` (see :mod:`llmq_api.health`; default: one of
    its own, 1 s backoff) learns from every produce and refuses requests at once while Kafka is known to be failing.
    """

    instance_id: str
    registry: WaiterRegistry
    producer: RequestProducer
    publish_cancel: CancelPublisher
    clock: Clock
    produce_timeout_ms: int
    accepting: Callable[[], bool] = lambda: True
    breaker: CircuitBreaker | None = None  # None: one of its own (see __post_init__)
    produce_timeout_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.produce_timeout_s = self.produce_timeout_ms / 1000
        self.breaker = self.breaker or CircuitBreaker(
            Dependency(KAFKA, self.clock),
            self.clock,
            backoff_ms=1000,
            max_backoff_ms=1000,
            probe_timeout_ms=self.produce_timeout_ms,
        )

    def build(
        self,
        valid: ValidRequest,
        *,
        request_id: str,
        principal: Principal,
        traffic_class: str,
        timeout_ms: int,
        idempotency_key: str | None = None,
    ) -> wire.GenerationRequest:
        """The wire request; ``deadline_ms`` = now + ``timeout_ms`` (epoch ms); replies go to this pod's channel."""
        now_ms = self.clock.now_ms()
        return valid.to_wire(
            principal,
            traffic_class,
            request_id=request_id,
            created_ms=now_ms,
            deadline_ms=now_ms + timeout_ms,
            reply_to=wire.HttpReply(instance_id=self.instance_id),
            idempotency_key=idempotency_key,
        )

    async def submit(self, request: wire.GenerationRequest) -> Waiter:
        """Register the request's waiter, then produce it. Returns the waiter.

        Raises ApiError 503 (+ Retry-After) when the pod is not accepting (draining, Kafka or the replies subscription
        not ready: a result could not reach the waiter), at once while the breaker is open, or when producing failed
        or took longer than the produce timeout (a Cancel then follows, in case the record lands later); 429 when the
        pod already holds its maximum of waiters.
        """
        if not self.accepting():
            raise unavailable("The service is not accepting requests right now", RETRY_AFTER_S)
        if self.registry.full:
            raise too_many_requests("Too many requests in flight on this server", RETRY_AFTER_S)
        if not self.breaker.allow():
            raise unavailable(
                "The request queue (Kafka) is failing; retry after the Retry-After delay",
                retry_after_s(self.breaker.retry_after_ms()),
                code=KAFKA_UNAVAILABLE,
            )
        waiter = self.registry.register(request.request_id, request.stream, request.tenant_id)
        started_ms = self.clock.now_ms()
        try:
            async with asyncio.timeout(self.produce_timeout_s):  # unlike wait_for, no task of its own per request
                await self.producer.produce(request)
        except BaseException as exc:
            self.registry.resolve(waiter, Abandoned(PRODUCE_FAILED_REASON))
            await self.publish_cancel(request.request_id, PRODUCE_FAILED_REASON)
            if isinstance(exc, Exception):
                log.warning(
                    "producing %s failed: %r", request.request_id, exc, extra={"request_id": request.request_id}
                )
                self.breaker.failed(_describe(exc, self.produce_timeout_s), started_ms)
                raise unavailable(
                    "The request queue is unavailable; retry shortly", retry_after_s(self.breaker.retry_after_ms())
                ) from None
            raise
        self.breaker.succeeded()
        return waiter


def _describe(exc: Exception, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"producing a request took longer than {timeout_s:g} s"
    return f"producing a request failed: {exc!r}"[:200]

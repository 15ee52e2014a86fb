"""The request path of ``/v1/completions`` and ``/v1/chat/completions`` once HTTP is parsed.

An :class:`Ask` is admitted (admission control, then the tenant's rate limits) and submitted: its waiter registered,
then produced to ``names.request_topic(class)``. With an Idempotency-Key, an earlier request holding the key answers
instead: its stored result, or its result once it has one (nothing runs again, nothing is charged twice). Either way
the caller gets the :class:`~llmq_api.responses.PendingRequest` its response holds the connection on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from llmq_api import idempotency
from llmq_api.admission import ShedPolicy
from llmq_api.auth import Principal
from llmq_api.catalog import ModelCatalog
from llmq_api.errors import ApiError, store_unavailable
from llmq_api.exchange import CancelPublisher
from llmq_api.gateway import Gateway
from llmq_api.metrics import ApiMetrics
from llmq_api.ratelimit import Charge, RateLimiter, check_fits, token_cost
from llmq_api.responses import PendingRequest
from llmq_api.resume import FIRST, StreamHolds
from llmq_api.saturation import SaturationMonitor
from llmq_api.validation import ValidRequest
from llmq_api.waiters import Resolution, Waiter, WaiterRegistry
from llmq_core import constants, ids, wire
from llmq_core.clock import Clock
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY, HTTP_IDEMPOTENT_REPLAYED, HTTP_LAST_EVENT_ID, HTTP_REQUEST_ID
from llmq_core.stream_log import resumable

log = logging.getLogger(__name__)

T = TypeVar("T")

JOIN_GRACE_MS = 2000  # a joined request's result may reach the result store this long after its deadline
REDIS_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Ask:
    """One generation request as the HTTP layer parsed it: who asks, in which class, for how long, and what."""

    request_id: str
    principal: Principal
    traffic_class: str
    timeout_ms: int
    idempotency_key: str | None
    valid: ValidRequest
    last_event_id: int | None = None  # a stream resumed: the id of the last event its client got (chars of text)


@dataclass(frozen=True)
class Admitted:
    """What an admitted request settles when it ends, the response headers admission adds (predicted wait), and what
    its measured queue wait is compared with: its priority class and predicted wait (ms; None: not predicted)."""

    charge: Charge
    headers: dict[str, str]
    priority_class: str = ""
    predicted_ms: int | None = None


@dataclass(eq=False, kw_only=True)
class Generation:
    """Admits, submits or joins generation requests; owns the tasks of retries following an earlier request."""

    gateway: Gateway
    store: idempotency.IdempotencyStore
    registry: WaiterRegistry
    shed: ShedPolicy
    saturation: SaturationMonitor
    limiter: RateLimiter
    catalog: ModelCatalog
    metrics: ApiMetrics
    publish_cancel: CancelPublisher
    clock: Clock
    holds: StreamHolds | None = None  # resumable streams' holds (None: a stream is cancelled once its client left)
    _followers: set[asyncio.Task] = field(default_factory=set, init=False)  # joined retries polling for a result

    async def admit(self, ask: Ask) -> Admitted:
        """Admission control (per model), then the tenant's rate limits; raises the 429 or 503 of the first that
        refuses (a 400 for a token estimate no bucket refill could ever cover). The admission counts as queued work at
        once (before the rate limiter's await lets a burst's other requests check) and is taken back if the rate
        limiter refuses; it counts as unfinished until its charge is settled or cancelled."""
        valid, principal = ask.valid, ask.principal
        priority_class = constants.priority_class(ask.traffic_class, principal.tier)
        estimate = token_cost(valid, self.catalog.context_windows().get(valid.model, 0))
        check_fits(estimate, principal.tokens_per_min, valid)
        saturation = self.saturation.current
        deferred_allowed = constants.DEFERRED in principal.classes
        rejection = self.shed.check(priority_class, valid.model, saturation, len(self.registry), deferred_allowed)
        if rejection is None:
            end = self.saturation.admit(valid.model, priority_class)
            try:
                rejection = await self.limiter.acquire(principal, estimate)
            except BaseException:  # e.g. 503 store_unavailable
                end(True)
                raise
            if rejection is not None:
                end(True)
        if rejection is not None:
            self.metrics.admission_rejections.labels(priority_class, rejection.reason).inc()
            raise rejection.error
        predicted_ms = saturation.predict(valid.model, priority_class).wait_ms
        return Admitted(
            Charge(self.limiter, principal, estimate, on_end=end),
            {constants.HTTP_PREDICTED_WAIT_MS: str(predicted_ms)},
            priority_class,
            predicted_ms,
        )

    async def submit_or_join(self, ask: Ask) -> PendingRequest:
        """Admit and submit ``ask``; with an Idempotency-Key another request claimed first, join that one instead
        (an error then names the request joined in its ``x-request-id``)."""
        request = self.gateway.build(
            ask.valid,
            request_id=ask.request_id,
            principal=ask.principal,
            traffic_class=ask.traffic_class,
            timeout_ms=ask.timeout_ms,
            idempotency_key=ask.idempotency_key,
        )
        if ask.idempotency_key is None:
            return await self._submit(request, ask.valid, await self.admit(ask))
        return await self._submit_or_join_keyed(ask, request)

    async def _submit_or_join_keyed(self, ask: Ask, request: wire.GenerationRequest) -> PendingRequest:
        """The first request with its tenant's Idempotency-Key claims the key and runs (the claim is released if the
        pod gives up on it); later ones join it: nothing runs again, nothing is charged twice."""
        key, tenant_id = ask.idempotency_key, ask.principal.tenant_id
        claim = idempotency.Claim(
            request_id=request.request_id,
            fingerprint=idempotency.fingerprint(ask.valid, ask.traffic_class),
            deadline_ms=request.deadline_ms,
        )
        earlier = await _redis_call(self.store.find(tenant_id, key))
        admitted = None
        if earlier is None and ask.last_event_id is not None:
            raise stream_not_found()
        if earlier is None:
            admitted = await self.admit(ask)
            earlier = await self._claim(tenant_id, key, claim, admitted.charge)
        if earlier is not None:
            try:
                return await self._join(request, ask, claim, earlier)
            except ApiError as exc:
                exc.headers[HTTP_REQUEST_ID] = earlier.request_id
                raise
        return await self._submit(request, ask.valid, admitted, self._releaser(tenant_id, key, request.request_id))

    def _releaser(self, tenant_id: str, key: str, request_id: str) -> Callable[[], Awaitable[None]]:
        """What drops ``request_id``'s claim on ``key`` once the pod gives up on it."""

        async def release() -> None:
            await self.store.release(tenant_id, key, request_id)

        return release

    async def result_for(self, principal: Principal, request_id: str) -> wire.FinalResult | None:
        """The stored result of ``request_id`` if ``principal``'s tenant sent it (None for anyone else, or while it
        runs): its HTTP request, or its Kafka-direct request of that id (stored under the tenant-scoped id); 503 when
        the store does not answer."""
        tenant_id = principal.tenant_id
        for stored_id in (request_id, *_kafka_direct_id(tenant_id, request_id)):
            result = await _redis_call(self.store.result(stored_id))
            if result is not None and result.tenant_id == tenant_id:
                return result
        return None

    async def stop(self) -> None:
        """Cancel the joined retries' polling (their connections are being closed) and the resume windows' waits."""
        if self.holds is not None:
            await self.holds.stop()
        followers = list(self._followers)
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)

    async def _claim(
        self, tenant_id: str, key: str, claim: idempotency.Claim, charge: Charge
    ) -> idempotency.Claim | None:
        """Claim ``key``; the claim that got there first if any: this request then joins it and is never charged."""
        try:
            earlier = await _redis_call(self.store.claim(tenant_id, key, claim))
        except BaseException:
            charge.cancel()
            raise
        if earlier is not None:
            charge.cancel()
        return earlier

    async def _submit(
        self,
        request: wire.GenerationRequest,
        valid: ValidRequest,
        admitted: Admitted,
        on_gave_up: Callable[[], Awaitable[None]] | None = None,
    ) -> PendingRequest:
        """Produce the request; its charge is settled by the resolution, or cancelled when producing fails.
        ``on_gave_up`` runs when the pod gives up on it, producing failed included."""
        try:
            waiter = await self.gateway.submit(request)
        except BaseException:
            admitted.charge.cancel()
            if on_gave_up is not None:
                await on_gave_up()
            raise
        publish_cancel = self.publish_cancel
        if on_gave_up is not None and self._resumes(request):  # its holds cancel it, and release its key
            publish_cancel, on_gave_up = self.holds.canceller(FIRST, on_gave_up), None
        return self._pending(
            request,
            waiter,
            valid,
            publish_cancel,
            on_gave_up=on_gave_up,
            on_resolved=self._settler(admitted),
            headers=admitted.headers,
        )

    def _settler(self, admitted: Admitted) -> Callable[[Resolution], None]:
        """What settles ``admitted`` by its resolution and compares its measured queue wait (a result's
        ``timings.queued_ms``: created to engine start) with admission's prediction."""

        def settle(resolution: Resolution) -> None:
            admitted.charge.settle(resolution)
            timings = resolution.timings if isinstance(resolution, wire.FinalResult) else None
            if admitted.predicted_ms is not None and timings is not None and timings.total_ms:
                self.metrics.predicted(admitted.priority_class, admitted.predicted_ms, timings.queued_ms)

        return settle

    def _resumes(self, request: wire.GenerationRequest) -> bool:
        """Whether ``request`` is a stream another connection may resume here."""
        return self.holds is not None and self.holds.window_ms > 0 and resumable(request)

    async def _join(
        self, request: wire.GenerationRequest, ask: Ask, claim: idempotency.Claim, earlier: idempotency.Claim
    ) -> PendingRequest:
        """A retry with a claimed Idempotency-Key: the earlier request's stored result, or its result once it has one.

        Nothing runs again, and leaving cancels nothing: the earlier request is not this connection's, unless it is a
        resumable stream, which this connection then holds (its events replayed from the log, after
        ``ask.last_event_id`` if given). 422 when the retry's parameters differ from the earlier request's.
        """
        if earlier.fingerprint != claim.fingerprint:
            raise ApiError(
                422,
                "This Idempotency-Key was already used with different parameters",
                param=HTTP_IDEMPOTENCY_KEY,
                code="idempotency_key_reused",
            )
        deadline_ms = min(request.deadline_ms, earlier.deadline_ms + JOIN_GRACE_MS)
        replay = msgspec.structs.replace(request, request_id=earlier.request_id, deadline_ms=deadline_ms)
        waiter = Waiter(earlier.request_id, replay.stream)  # not registered: replies for it go to the earlier pod
        result = await _redis_call(self.store.result(earlier.request_id))
        if result is None and self.clock.now_ms() >= earlier.deadline_ms + JOIN_GRACE_MS:
            raise result_evicted()
        publish_cancel, resumes = _cancel_nothing, self._resumes(replay)
        if resumes and result is None:  # this connection holds it now
            token = await _redis_call(self.holds.take(earlier.request_id, deadline_ms - self.clock.now_ms()))
            release = self._releaser(ask.principal.tenant_id, ask.idempotency_key, earlier.request_id)
            publish_cancel = self.holds.canceller(token, release)
        if resumes:
            self._follow(self.store.follow_stream(waiter, self.registry, deadline_ms))
            self.metrics.stream_resumes.labels("resumed" if ask.last_event_id is not None else "replayed").inc()
        elif result is not None:
            self.registry.resolve(waiter, result)
        else:
            self._follow(self.store.follow(waiter, self.registry, deadline_ms))
        self.metrics.idempotent_replays.inc()
        pending = self._pending(replay, waiter, ask.valid, publish_cancel, headers={HTTP_IDEMPOTENT_REPLAYED: "true"})
        pending.last_event_id = ask.last_event_id
        return pending

    def _follow(self, following: Awaitable[None]) -> None:
        follower = asyncio.create_task(following)
        self._followers.add(follower)
        follower.add_done_callback(self._followers.discard)

    def _pending(
        self,
        request: wire.GenerationRequest,
        waiter: Waiter,
        valid: ValidRequest,
        publish_cancel: CancelPublisher,
        *,
        on_gave_up: Callable[[], Awaitable[None]] | None = None,
        on_resolved: Callable[[Resolution], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> PendingRequest:
        return PendingRequest(
            request=request,
            waiter=waiter,
            include_usage=valid.include_usage,
            registry=self.registry,
            publish_cancel=publish_cancel,
            metrics=self.metrics,
            clock=self.clock,
            on_gave_up=on_gave_up,
            on_resolved=on_resolved,
            headers=headers or {},
        )


def result_evicted() -> ApiError:
    """The earlier request has ended, but its stored result is gone: past ``result_ttl_s``, or dropped as one of its
    tenant's oldest past ``result_store_tenant_max_bytes`` (or evicted under Redis' memory budget)."""
    return ApiError(
        410,
        "The request this Idempotency-Key ran has ended and its result is no longer stored; "
        "send a new key to run it again",
        param=HTTP_IDEMPOTENCY_KEY,
        code="result_evicted",
    )


def stream_not_found() -> ApiError:
    """A resume (``Last-Event-ID``) whose Idempotency-Key names no request: it never ran, was cancelled and its claim
    released (its client and every later one left for the resume window), or ended longer ago than results are kept."""
    return ApiError(
        404,
        "No stream with this Idempotency-Key is running or stored; send the request without Last-Event-ID to run it",
        param=HTTP_LAST_EVENT_ID,
        code="stream_not_found",
    )


async def _cancel_nothing(request_id: str, reason: str) -> None:
    """The CancelPublisher of a joined retry: the request belongs to the connection that started it."""


async def _redis_call(call: Awaitable[T]) -> T:
    """Await a Redis-backed lookup or claim; Redis trouble becomes a 503 the client may retry."""
    try:
        return await asyncio.wait_for(call, REDIS_TIMEOUT_S)
    except Exception as exc:
        log.warning("Redis lookup failed: %r", exc)
        raise store_unavailable(exc) from None


def _kafka_direct_id(tenant_id: str, request_id: str) -> tuple[str, ...]:
    """The id the tenant's Kafka-direct request ``request_id`` ran under; none for a tenant whose ids are not scoped."""
    try:
        return (ids.tenant_scoped_id(tenant_id, request_id),)
    except ValueError:
        return ()

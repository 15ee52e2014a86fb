"""The FastAPI app of an API pod: OpenAI-compatible endpoints, stored results, health, readiness and metrics.

Generation flow: request id -> API key -> headers (class, timeout, idempotency key) -> body (size, JSON, params, model,
context) -> an earlier request with the same idempotency key answers instead -> admission control and the tenant's
rate limits -> waiter registered -> produced to ``requests_topic(class)`` -> held until the resolution (see
:mod:`llmq_api.responses`). Client mistakes and refusals are answered with OpenAI error bodies before anything reaches
Kafka (and before any SSE byte); anything unexpected becomes a clean 500 JSON.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from llmq_api import health, idempotency, validation
from llmq_api.access_log import AccessLog
from llmq_api.auth import Principal
from llmq_api.batch_jobs import router as batch_jobs_router
from llmq_api.errors import INVALID_REQUEST, SERVER_ERROR, ApiError, store_unavailable
from llmq_api.openai_format import CLIENT_GONE_STATUS, error_for, response_body, usage_dict
from llmq_api.pod import Pod
from llmq_api.ratelimit import Charge, check_fits, token_cost
from llmq_api.responses import PendingRequest, ResultResponse, StreamResponse
from llmq_api.waiters import Waiter
from llmq_core import constants, tracing, wire
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY, HTTP_REQUEST_ID, HTTP_TIMEOUT_MS, HTTP_TRAFFIC_CLASS

log = logging.getLogger(__name__)

T = TypeVar("T")

_ID_PREFIX = {"completions": "cmpl", "chat.completions": "chatcmpl"}
IDEMPOTENT_REPLAYED = "idempotent-replayed"  # response header of a retry answered by an earlier request
JOIN_GRACE_MS = 2000  # a joined request's result may reach the result store this long after its deadline
REDIS_TIMEOUT_S = 1.0


def create_app(pod: Pod) -> FastAPI:
    """The ASGI app serving ``pod``; its lifespan starts and stops the pod's background loops."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await pod.start()
        try:
            yield
        finally:
            await pod.stop()

    app = FastAPI(title="llmq", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pod = pod
    app.include_router(batch_jobs_router)  # /v1/files, /v1/batches
    if tracing.enabled():  # configured before the app is built; off, requests skip the extra layer
        app.add_middleware(tracing.AsgiTracing)  # a server span per /v1/ request
    if pod.settings.api_access_log:
        app.add_middleware(AccessLog, tenant_of=pod.keys.tenant_of)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(pod, request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(pod, request, "chat.completions")

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        pod.keys.authenticate(request.headers.get("authorization"))  # as on OpenAI: the catalogue is for callers
        return {"object": "list", "data": pod.catalog.listing()}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> dict:
        pod.keys.authenticate(request.headers.get("authorization"))
        for entry in pod.catalog.listing():
            if entry["id"] == model:
                return entry
        raise ApiError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")

    @app.get("/v1/requests/{request_id}")
    async def get_request(request_id: str, request: Request) -> dict:
        """A finished request's outcome, for the tenant that sent it (404 for anyone else, or while it runs)."""
        principal = pod.keys.authenticate(request.headers.get("authorization"))
        result = await _redis_call(pod.idempotency.result(request_id))
        if result is None or result.tenant_id != principal.tenant_id:
            raise ApiError(
                404, f"No finished request '{request_id}' found", param="request_id", code="request_not_found"
            )
        return _request_object(result)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """For the Service: 503 until Kafka and Redis were reached once, and while draining; 200 otherwise, also
        ``degraded`` (see :func:`llmq_api.health.report`)."""
        ready, body = health.report(pod.dependencies, pod.draining)
        checks = {
            "kafka_producer": pod.producer.ready,
            "replies_subscription": pod.listener.subscribed,
            "draining": pod.draining,
        }
        return JSONResponse({**body, **checks}, status_code=200 if ready else 503)

    @app.get("/dependencies")
    async def dependencies() -> JSONResponse:
        """For a global load balancer that fails a region over: 503 while Kafka or Redis is not up."""
        healthy, body = health.dependencies_report(pod.dependencies)
        return JSONResponse(body, status_code=200 if healthy else 503)

    _install_error_handlers(app, pod)
    return app


async def _generate(pod: Pod, request: Request, endpoint: wire.Endpoint) -> Response:
    request_id = f"{_ID_PREFIX[endpoint]}-{uuid.uuid4().hex}"
    request.state.request_id = request_id
    request.state.endpoint = endpoint
    headers = request.headers
    principal = pod.keys.authenticate(headers.get("authorization"))
    validation.check_content_type(headers.get("content-type"))
    traffic_class = principal.pick_class(headers.get(HTTP_TRAFFIC_CLASS))
    request.state.traffic_class = traffic_class
    timeout_ms = validation.parse_timeout_ms(headers.get(HTTP_TIMEOUT_MS), *pod.timeouts[traffic_class])
    idempotency_key = idempotency.parse_key(headers.get(HTTP_IDEMPOTENCY_KEY))
    body = await _read_body(request, pod.settings.api_max_body_bytes)
    parse = validation.parse_chat if endpoint == "chat.completions" else validation.parse_completion
    valid = parse(body, pod.catalog.context_windows(), max_stop_bytes=pod.settings.api_max_stop_bytes)
    request.state.model = valid.model
    generation = pod.gateway.build(
        valid,
        request_id=request_id,
        principal=principal,
        traffic_class=traffic_class,
        timeout_ms=timeout_ms,
        idempotency_key=idempotency_key,
    )
    if idempotency_key is None:
        charge, predicted = await _admit(pod, principal, traffic_class, valid)
        return await _run(pod, generation, valid, charge=charge, headers=predicted)
    claim = idempotency.Claim(
        request_id=request_id,
        fingerprint=idempotency.fingerprint(valid, traffic_class),
        deadline_ms=generation.deadline_ms,
    )
    earlier = await _redis_call(pod.idempotency.find(principal.tenant_id, idempotency_key))
    charge = predicted = None
    if earlier is None:
        charge, predicted = await _admit(pod, principal, traffic_class, valid)
        try:
            earlier = await _redis_call(pod.idempotency.claim(principal.tenant_id, idempotency_key, claim))
        except BaseException:
            charge.cancel()
            raise
        if earlier is not None:  # joins the request that claimed the key first: never charged twice
            charge.cancel()
    if earlier is not None:
        request.state.request_id = earlier.request_id
        return await _join(pod, generation, valid, claim, earlier)

    async def release() -> None:
        await pod.idempotency.release(principal.tenant_id, idempotency_key, request_id)

    return await _run(pod, generation, valid, release, charge=charge, headers=predicted)


async def _admit(
    pod: Pod, principal: Principal, traffic_class: str, valid: validation.ValidRequest
) -> tuple[Charge, dict[str, str]]:
    """Admission control (per model), then the tenant's rate limits; raises the 429 or 503 of the first that refuses (a
    400 for a token estimate no bucket refill could ever cover). The admission counts as queued work at once (before
    the rate limiter's await lets a burst's other requests check) and is taken back if the rate limiter refuses; it
    counts as unfinished until its charge is settled or cancelled. Returns the charge the request settles when it ends
    and the predicted-wait response header."""
    priority_class = constants.priority_class(traffic_class, principal.tier)
    estimate = token_cost(valid, pod.catalog.context_windows().get(valid.model, 0))
    check_fits(estimate, principal.tokens_per_min, valid)
    saturation = pod.saturation.current
    rejection = pod.shed.check(priority_class, valid.model, saturation, len(pod.registry))
    if rejection is None:
        end = pod.saturation.admit(valid.model, priority_class)
        try:
            rejection = await pod.limiter.acquire(principal, estimate)
        except BaseException:  # e.g. 503 store_unavailable
            end(True)
            raise
        if rejection is not None:
            end(True)
    if rejection is not None:
        pod.metrics.admission_rejections.labels(priority_class, rejection.reason).inc()
        raise rejection.error
    predicted = {constants.HTTP_PREDICTED_WAIT_MS: str(saturation.predict(valid.model, priority_class).wait_ms)}
    return Charge(pod.limiter, principal, estimate, on_end=end), predicted


async def _run(
    pod: Pod,
    generation: wire.GenerationRequest,
    valid: validation.ValidRequest,
    on_gave_up: Callable[[], Awaitable[None]] | None = None,
    *,
    charge: Charge | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """Produce the request and hold the connection until its resolution; ``on_gave_up`` also runs if producing fails.
    ``charge`` is settled by the resolution, or cancelled when producing fails."""
    try:
        waiter = await pod.gateway.submit(generation)
    except BaseException:
        if charge is not None:
            charge.cancel()
        if on_gave_up is not None:
            await on_gave_up()
        raise
    pending = PendingRequest(
        request=generation,
        waiter=waiter,
        include_usage=valid.include_usage,
        registry=pod.registry,
        publish_cancel=pod.publish_cancel,
        metrics=pod.metrics,
        clock=pod.clock,
        on_gave_up=on_gave_up,
        on_resolved=charge and charge.settle,
        headers=headers,
    )
    return StreamResponse(pending) if valid.stream else ResultResponse(pending)


async def _join(
    pod: Pod,
    generation: wire.GenerationRequest,
    valid: validation.ValidRequest,
    claim: idempotency.Claim,
    earlier: idempotency.Claim,
) -> Response:
    """A retry with a claimed Idempotency-Key: the earlier request's stored result, or its result once it has one.

    Nothing runs again and leaving cancels nothing: the earlier request is not this connection's. 422 when the retry's
    parameters differ from the earlier request's.
    """
    if earlier.fingerprint != claim.fingerprint:
        raise ApiError(
            422,
            "This Idempotency-Key was already used with different parameters",
            param=HTTP_IDEMPOTENCY_KEY,
            code="idempotency_key_reused",
        )
    deadline_ms = min(generation.deadline_ms, earlier.deadline_ms + JOIN_GRACE_MS)
    replay = msgspec.structs.replace(generation, request_id=earlier.request_id, deadline_ms=deadline_ms)
    waiter = Waiter(earlier.request_id, replay.stream)  # not registered: replies for it go to the earlier pod
    result = await _redis_call(pod.idempotency.result(earlier.request_id))
    if result is None and pod.clock.now_ms() >= earlier.deadline_ms + JOIN_GRACE_MS:
        raise result_evicted()
    if result is not None:
        pod.registry.resolve(waiter, result)
    else:
        follower = asyncio.create_task(pod.idempotency.follow(waiter, pod.registry, deadline_ms))
        pod.followers.add(follower)
        follower.add_done_callback(pod.followers.discard)
    pod.metrics.idempotent_replays.inc()
    pending = PendingRequest(
        request=replay,
        waiter=waiter,
        include_usage=valid.include_usage,
        registry=pod.registry,
        publish_cancel=_cancel_nothing,
        metrics=pod.metrics,
        clock=pod.clock,
        headers={IDEMPOTENT_REPLAYED: "true"},
    )
    return StreamResponse(pending) if valid.stream else ResultResponse(pending)


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


async def _cancel_nothing(request_id: str, reason: str) -> None:
    """The CancelPublisher of a joined retry: the request belongs to the connection that started it."""


async def _redis_call(call: Awaitable[T]) -> T:
    """Await a Redis-backed lookup or claim; Redis trouble becomes a 503 the client may retry."""
    try:
        return await asyncio.wait_for(call, REDIS_TIMEOUT_S)
    except Exception as exc:
        log.warning("Redis lookup failed: %r", exc)
        raise store_unavailable(exc) from None


def _request_object(result: wire.FinalResult) -> dict:
    """``llmq.request``: the outcome, its usage (of an interrupted stream: the tokens the caller received), and the
    OpenAI response body (succeeded) or the error the caller got."""
    error = error_for(result)
    return {
        "id": result.request_id,
        "object": "llmq.request",
        "status": result.outcome.value,
        "model": result.model,
        "created": result.created_ms // 1000,
        "finished": result.finished_ms // 1000,
        "response": None
        if error
        else response_body(result, result.request_id, result.endpoint, result.created_ms // 1000),
        "error": error.body()["error"] if error else None,
        "usage": usage_dict(result.usage),
    }


async def _read_body(request: Request, limit_bytes: int) -> bytes:
    """The request body; 413 as soon as it is known to exceed ``limit_bytes``."""
    validation.check_declared_length(request.headers.get("content-length"), limit_bytes)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit_bytes:
                raise validation.too_large(limit_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(
            CLIENT_GONE_STATUS, "The client disconnected while sending the body", code="client_disconnected"
        ) from None
    return b"".join(chunks)


def _install_error_handlers(app: FastAPI, pod: Pod) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = exc.response_headers()
        request_id = getattr(request.state, "request_id", None)
        if request_id:
            headers[HTTP_REQUEST_ID] = request_id
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint:
            pod.metrics.finished(
                endpoint, "rejected" if exc.status < 500 and exc.status != 429 else "unavailable", exc.status
            )
            pod.metrics.answered(
                getattr(request.state, "traffic_class", None), getattr(request.state, "model", None), exc.status
            )
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RedisError)
    async def store_error(request: Request, exc: RedisError) -> JSONResponse:
        """Redis refused a write (maxmemory) or failed in a handler (files, batches): 503, not 500."""
        log.warning("Redis failed %s %s: %r", request.method, request.url.path, exc)
        return await api_error(request, store_unavailable(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(
            exc.status_code, str(exc.detail), type=INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
        )
        return JSONResponse(
            error.body(), status_code=exc.status_code, headers={**(exc.headers or {}), **error.response_headers()}
        )

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A query or path parameter of the wrong type (``?limit=abc``): 400 naming it, not FastAPI's 422 shape."""
        first = (exc.errors() or [{}])[0]
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        error = ApiError(
            400, f"Invalid parameter {param!r}: {first.get('msg', 'invalid value')}", param=param, code="invalid_type"
        )
        return JSONResponse(error.body(), status_code=400, headers=error.response_headers())

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", None)
        log.exception("unexpected error", extra={"request_id": request_id} if request_id else None)
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint:
            pod.metrics.finished(endpoint, "internal_error", 500)
            pod.metrics.answered(
                getattr(request.state, "traffic_class", None), getattr(request.state, "model", None), 500
            )
        error = ApiError(500, "The server had an error while processing the request", type=SERVER_ERROR)
        headers = error.response_headers()
        if request_id:
            headers[HTTP_REQUEST_ID] = request_id
        return JSONResponse(error.body(), status_code=500, headers=headers)

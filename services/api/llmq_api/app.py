"""The FastAPI app of an API pod: OpenAI-compatible endpoints, health, readiness and metrics.

Generation flow: request id -> headers -> body (size, JSON, params, model, context) -> waiter registered -> produced to
``requests_topic(class)`` -> held until the resolution (see :mod:`llmq_api.responses`). Client mistakes are answered
with OpenAI error bodies before anything reaches Kafka; anything unexpected becomes a clean 500 JSON.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from llmq_core import wire
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY, HTTP_REQUEST_ID, HTTP_TIMEOUT_MS, HTTP_TRAFFIC_CLASS
from llmq_api import validation
from llmq_api.batch_jobs import router as batch_jobs_router
from llmq_api.errors import INVALID_REQUEST, SERVER_ERROR, ApiError
from llmq_api.openai_format import CLIENT_GONE_STATUS
from llmq_api.pod import Pod
from llmq_api.responses import PendingRequest, ResultResponse, StreamResponse

log = logging.getLogger(__name__)

_ID_PREFIX = {"completions": "cmpl", "chat.completions": "chatcmpl"}


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

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(pod, request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(pod, request, "chat.completions")

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": pod.catalog.listing()}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict:
        for entry in pod.catalog.listing():
            if entry["id"] == model:
                return entry
        raise ApiError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        checks = {"kafka_producer": pod.producer.ready, "replies_subscription": pod.listener.subscribed,
                  "draining": pod.draining}
        return JSONResponse({"ready": pod.ready, **checks}, status_code=200 if pod.ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(pod.metrics.render(), media_type=pod.metrics.content_type)

    _install_error_handlers(app, pod)
    return app


async def _generate(pod: Pod, request: Request, endpoint: wire.Endpoint) -> Response:
    request_id = f"{_ID_PREFIX[endpoint]}-{uuid.uuid4().hex}"
    request.state.request_id = request_id
    request.state.endpoint = endpoint
    headers = request.headers
    validation.check_content_type(headers.get("content-type"))
    timeout_ms = validation.parse_timeout_ms(headers.get(HTTP_TIMEOUT_MS), pod.settings.default_timeout_ms,
                                             pod.settings.max_timeout_ms)
    traffic_class = validation.parse_traffic_class(headers.get(HTTP_TRAFFIC_CLASS))
    principal = pod.authenticator.authenticate(headers.get("authorization"))
    body = await _read_body(request, pod.settings.api_max_body_bytes)
    parse = validation.parse_chat if endpoint == "chat.completions" else validation.parse_completion
    valid = parse(body, pod.catalog.context_windows())
    generation = pod.gateway.build(valid, request_id=request_id, principal=principal, traffic_class=traffic_class,
                                   timeout_ms=timeout_ms, idempotency_key=headers.get(HTTP_IDEMPOTENCY_KEY))
    waiter = await pod.gateway.submit(generation)
    pending = PendingRequest(request=generation, waiter=waiter, include_usage=valid.include_usage,
                             registry=pod.registry, publish_cancel=pod.publish_cancel, metrics=pod.metrics,
                             clock=pod.clock)
    return StreamResponse(pending) if valid.stream else ResultResponse(pending)


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
        raise ApiError(CLIENT_GONE_STATUS, "The client disconnected while sending the body",
                       code="client_disconnected") from None
    return b"".join(chunks)


def _install_error_handlers(app: FastAPI, pod: Pod) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = dict(exc.headers)
        request_id = getattr(request.state, "request_id", None)
        if request_id:
            headers[HTTP_REQUEST_ID] = request_id
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint:
            pod.metrics.finished(endpoint, "rejected" if exc.status < 500 and exc.status != 429 else "unavailable",
                                 exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(exc.status_code, str(exc.detail), type=INVALID_REQUEST if exc.status_code < 500 else
                         SERVER_ERROR)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", None)
        log.exception("unexpected error", extra={"request_id": request_id} if request_id else None)
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint:
            pod.metrics.finished(endpoint, "internal_error", 500)
        error = ApiError(500, "The server had an error while processing the request", type=SERVER_ERROR)
        return JSONResponse(error.body(), status_code=500,
                            headers={HTTP_REQUEST_ID: request_id} if request_id else None)

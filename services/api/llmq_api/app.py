"""The FastAPI app of an API pod: OpenAI-compatible and Anthropic-compatible endpoints, stored results, health,
readiness and metrics.

Generation flow: request id -> API key -> headers (class, timeout, idempotency key) -> body (size, JSON, params, model,
context) (:class:`Intake`, here, through the route's :class:`Edge`) -> admitted and submitted, or joined to an earlier
request with the same idempotency key (:mod:`llmq_api.generation`) -> held until the resolution (see
:mod:`llmq_api.responses`). One path inside the pod; the edge of a route says which wire format (OpenAI's or
Anthropic's) its bodies, results, streams and errors have. Client mistakes and refusals are answered with the
caller's error bodies before anything reaches Kafka (and before any SSE byte); anything unexpected becomes a clean
500 JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmq_api import anthropic_format, anthropic_messages, health, idempotency, unsupported, validation
from llmq_api.access_log import AccessLog, route_of
from llmq_api.anthropic_format import ANTHROPIC_DIALECT
from llmq_api.auth import KeyStore, Principal
from llmq_api.batch_jobs import router as batch_jobs_router
from llmq_api.batch_jobs.message_routes import router as message_batches_router
from llmq_api.bodies import read_body
from llmq_api.catalog import ModelCatalog
from llmq_api.errors import ApiError, store_unavailable
from llmq_api.generation import Ask, Generation
from llmq_api.hot_routes import HotRoutesApp
from llmq_api.metrics import ApiMetrics
from llmq_api.openai_format import OPENAI, error_for
from llmq_api.pod import Pod
from llmq_api.responses import Dialect, ResultResponse, StreamResponse
from llmq_api.stream_events import parse_last_event_id
from llmq_core import api_formats, ids, tracing, wire
from llmq_core.constants import (
    ANTHROPIC,
    HTTP_ANTHROPIC_VERSION,
    HTTP_IDEMPOTENCY_KEY,
    HTTP_LAST_EVENT_ID,
    HTTP_REQUEST_ID,
    HTTP_SDK_READ_TIMEOUT,
    HTTP_TIMEOUT_MS,
    HTTP_TRAFFIC_CLASS,
)
from llmq_core.requests import echo, timeouts_by_class
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType, OutcomeLabel
from llmq_core.token_counts import TokenCounter

log = logging.getLogger(__name__)


def _bearer(keys: KeyStore, headers) -> Principal:
    return keys.authenticate(headers.get("authorization"))


@dataclass(frozen=True)
class Edge:
    """What one generation route's wire format decides before the one path: its metrics ``label`` (and the
    ``request.state.endpoint``), its ids' ``id_prefix``, how the caller is ``authenticate``d from the headers (and
    what else they must say), how its body is ``parse``d (``validation.parse``'s signature), its ``dialect``."""

    label: str
    id_prefix: str
    authenticate: Callable[[KeyStore, object], Principal]
    parse: Callable[..., validation.ValidRequest]
    dialect: Dialect = OPENAI


COMPLETIONS = Edge("completions", "cmpl", _bearer, validation.parse_completion)
CHAT = Edge("chat.completions", "chatcmpl", _bearer, validation.parse_chat)
MESSAGES = Edge("messages", "msg", anthropic_format.authenticate, anthropic_messages.parse_messages, ANTHROPIC_DIALECT)


def create_app(pod: Pod) -> FastAPI:
    """The ASGI app serving ``pod``; its lifespan starts and stops the pod's background loops. The routes reach the
    pod's generation service, key store, catalog, metrics and probes (``batch_files``, ``batch_jobs`` and ``keys`` on ``app.state`` for
    the ``/v1/files`` and ``/v1/batches`` routes)."""
    keys, catalog, generation, metrics = pod.keys, pod.catalog, pod.generation, pod.metrics
    intake = Intake(keys, catalog, pod.settings, pod.token_counters)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await pod.start()
        try:
            yield
        finally:
            await pod.stop()

    app = HotRoutesApp(title="llmq", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.keys, app.state.batch_files, app.state.batch_jobs = keys, pod.batch_files, pod.batch_jobs
    app.state.message_batches = pod.message_batches
    if tracing.enabled():  # configured before the app is built; off, requests skip the extra layer
        app.add_middleware(tracing.AsgiTracing)  # a server span per /v1/ request
    if pod.settings.api.access_log:
        app.add_middleware(AccessLog, tenant_of=pod.keys.tenant_of)

    async def completions(request: Request) -> Response:
        return await _generate(intake, generation, request, COMPLETIONS)

    async def chat_completions(request: Request) -> Response:
        return await _generate(intake, generation, request, CHAT)

    async def messages(request: Request) -> Response:
        return await _generate(intake, generation, request, MESSAGES)

    # The hot routes first, as plain Starlette routes: they take the Request and return a Response, so FastAPI's
    # parameter solving and response serialization only cost time (about a third of the app's CPU per request).
    app.add_hot_route("/v1/completions", completions)
    app.add_hot_route("/v1/chat/completions", chat_completions)
    app.add_hot_route("/v1/messages", messages)
    if not tracing.enabled():  # past Starlette's layers too (see llmq_api.hot_routes); traced, through them all
        access_log = pod.settings.api.access_log
        app.hot_stack = AccessLog(app.serve_hot, tenant_of=pod.keys.tenant_of) if access_log else app.serve_hot
    app.include_router(batch_jobs_router)  # /v1/files, /v1/batches
    app.include_router(message_batches_router)  # /v1/messages/batches

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict:
        """Anthropic's token count of a Messages body, with the model's own tokenizer and chat template."""
        request.state.dialect = ANTHROPIC_DIALECT
        anthropic_format.authenticate(keys, request.headers)
        validation.check_content_type(request.headers.get("content-type"))
        body = await read_body(request, pod.settings.api.max_body_bytes)
        return {"input_tokens": anthropic_messages.count_tokens(body, catalog.context_windows(), pod.token_counters)}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        """OpenAI's list; Anthropic's page when the request carries ``anthropic-version``."""
        if _models_caller(keys, request) is ANTHROPIC_DIALECT:
            return anthropic_format.model_list(catalog.listing())
        return {"object": "list", "data": catalog.listing()}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> dict:
        anthropic = _models_caller(keys, request) is ANTHROPIC_DIALECT
        for entry in catalog.listing():
            if entry["id"] == model:
                return anthropic_format.model_info(entry) if anthropic else entry
        raise ApiError(404, f"The model {echo(model)} does not exist", param="model", code=ErrorCode.MODEL_NOT_FOUND)

    @app.get("/v1/requests/{request_id}")
    async def get_request(request_id: str, request: Request) -> dict:
        """A finished request's outcome, for the tenant that sent it (404 for anyone else, or while it runs)."""
        result = await generation.result_for(keys.authenticate(request.headers.get("authorization")), request_id)
        if result is None:
            raise ApiError(
                404, f"No finished request {echo(request_id)} found", param="request_id", code="request_not_found"
            )
        return _request_object(result)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """For the Service: 503 until Kafka and Redis were reached once, and while draining; 200 otherwise, also
        ``degraded`` (see :meth:`Pod.readiness`)."""
        ready, body = pod.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/dependencies")
    async def dependencies() -> JSONResponse:
        """For a global load balancer that fails a region over: 503 while Kafka or Redis is not up."""
        healthy, body = health.dependencies_report(pod.dependencies)
        return JSONResponse(body, status_code=200 if healthy else 503)

    _install_error_handlers(app, metrics)
    return app


class Intake:
    """HTTP's part of a generation request: API key, headers (class, timeout, idempotency key) and body (size, JSON,
    params, model, context) parsed into an :class:`~llmq_api.generation.Ask`; each step's 4xx is raised as it is
    found, and what is known so far is noted on ``request.state`` for the error response and its metrics."""

    def __init__(
        self, keys: KeyStore, catalog: ModelCatalog, settings: Settings, counters: Mapping[str, TokenCounter]
    ) -> None:
        self._keys = keys
        self._counters = counters
        self._catalog = catalog
        self._timeouts = timeouts_by_class(settings)
        self._max_body_bytes = settings.api.max_body_bytes
        self._max_stop_bytes = settings.api.max_stop_bytes
        self._max_schema_bytes = settings.api.max_json_schema_bytes  # response_format, tools, output_config
        self._region = settings.region.name
        self.sse_keep_alive_s = settings.api.sse_keep_alive_ms / 1000

    async def parse(self, request: Request, edge: Edge) -> Ask:
        request_id = ids.request_id(self._region, edge.id_prefix)
        request.state.request_id = request_id
        request.state.endpoint = edge.label
        request.state.dialect = edge.dialect
        headers = request.headers
        principal = edge.authenticate(self._keys, headers)
        validation.check_content_type(headers.get("content-type"))
        traffic_class = principal.pick_class(headers.get(HTTP_TRAFFIC_CLASS))
        request.state.traffic_class = traffic_class
        default_ms, max_ms = self._timeouts[traffic_class]
        timeout_ms = validation.parse_timeout_ms(headers.get(HTTP_TIMEOUT_MS), default_ms, max_ms)
        sdk_timeout_ms = validation.parse_sdk_read_timeout_ms(headers.get(HTTP_SDK_READ_TIMEOUT), max_ms)
        idempotency_key = idempotency.parse_key(headers.get(HTTP_IDEMPOTENCY_KEY))
        body = await read_body(request, self._max_body_bytes)
        valid = edge.parse(
            body,
            self._catalog.context_windows(),
            max_stop_bytes=self._max_stop_bytes,
            counters=self._counters,
            max_schema_bytes=self._max_schema_bytes,
        )
        request.state.model = valid.model
        last_event_id = parse_last_event_id(
            headers.get(HTTP_LAST_EVENT_ID), keyed=idempotency_key is not None, stream=valid.stream
        )
        if sdk_timeout_ms is not None and HTTP_TIMEOUT_MS not in headers and not valid.stream:
            timeout_ms = sdk_timeout_ms  # the whole answer is one read of the SDK's: its timeout is the deadline
        return Ask(
            request_id=request_id,
            principal=principal.at_tier(valid.asked_tier),
            traffic_class=traffic_class,
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            valid=valid,
            last_event_id=last_event_id,
        )


async def _generate(intake: Intake, generation: Generation, request: Request, edge: Edge) -> Response:
    pending = await generation.submit_or_join(await intake.parse(request, edge))
    request.state.request_id = pending.request_id  # a joined retry answers under the earlier request's id
    if pending.request.stream:
        return StreamResponse(pending, edge.dialect, intake.sse_keep_alive_s)
    return ResultResponse(pending, edge.dialect)


def _models_caller(keys: KeyStore, request: Request) -> Dialect:
    """Who asks for the model catalogue (a caller: 401 otherwise): Anthropic's SDK when the request carries
    ``anthropic-version`` (its key in ``x-api-key`` or ``Authorization``), OpenAI's otherwise."""
    if HTTP_ANTHROPIC_VERSION not in request.headers:
        _bearer(keys, request.headers)
        return OPENAI
    request.state.dialect = ANTHROPIC_DIALECT
    anthropic_format.authenticate(keys, request.headers)
    return ANTHROPIC_DIALECT


def dialect_of(request: Request) -> Dialect:
    """The wire format a request's errors are answered in: its route's, or Anthropic's for a request to
    ``/v1/messages...`` or carrying ``anthropic-version`` that no route claimed (an unknown path, a wrong method)."""
    dialect = getattr(request.state, "dialect", None)
    if dialect is not None:
        return dialect
    anthropic = anthropic_format.speaks_anthropic(request.url.path, request.headers.keys())
    return ANTHROPIC_DIALECT if anthropic else OPENAI


def _request_object(result: wire.FinalResult) -> dict:
    """``llmq.request``: the outcome, its usage (of an interrupted stream: the tokens the caller received), and the
    OpenAI response body (succeeded) or the error the caller got."""
    error = error_for(result)
    request_id = ids.producer_request_id(result.request_id)  # a Kafka-direct request: the id its producer gave
    return {
        "id": request_id,
        "object": "llmq.request",
        "status": result.outcome.value,
        "model": result.model,
        "created": result.created_ms // 1000,
        "finished": result.finished_ms // 1000,
        "response": None if error else _stored_response(result, request_id),
        "error": error.body()["error"] if error else None,
        "usage": api_formats.usage_dict(result.usage),
    }


def _stored_response(result: wire.FinalResult, request_id: str) -> dict:
    """A succeeded result's body as its caller got it: an Anthropic message, or an OpenAI completion."""
    if result.api_format == ANTHROPIC:
        return api_formats.message_body(result, request_id)
    return api_formats.response_body(result, request_id, result.endpoint, result.created_ms // 1000)


def _install_error_handlers(app: FastAPI, metrics: ApiMetrics) -> None:
    def answer(request: Request, error: ApiError, outcome: str) -> JSONResponse:
        """``error`` as the response in the caller's dialect, naming the request it ended; a generation request's
        counted as ``outcome``."""
        request_id = error.headers.get(HTTP_REQUEST_ID) or getattr(request.state, "request_id", None)
        status, body, headers = dialect_of(request).error(error, request_id)
        if request_id:
            headers.setdefault(HTTP_REQUEST_ID, request_id)  # a joined retry's error names the request it joined
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint:
            metrics.finished(endpoint, outcome, status)
            metrics.answered(
                getattr(request.state, "traffic_class", None), getattr(request.state, "model", None), status
            )
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return answer(
            request, exc, OutcomeLabel.REJECTED if exc.status < 500 and exc.status != 429 else OutcomeLabel.UNAVAILABLE
        )

    @app.exception_handler(RedisError)
    async def store_error(request: Request, exc: RedisError) -> JSONResponse:
        """Redis refused a write (maxmemory) or failed in a handler (files, batches): 503, not 500."""
        log.warning("Redis failed: %r", exc, extra={"method": request.method, "route": route_of(request.scope)})
        return answer(request, store_unavailable(exc), OutcomeLabel.UNAVAILABLE)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(
            exc.status_code,
            str(exc.detail),
            type=ErrorType.INVALID_REQUEST if exc.status_code < 500 else ErrorType.SERVER,
        )
        if exc.status_code == 404:  # no route (every 404 of llmq's own is an ApiError)
            error = unsupported.not_found(request.method, request.url.path)
        status, body, headers = dialect_of(request).error(error, None)
        return JSONResponse(body, status_code=status, headers={**(exc.headers or {}), **headers})

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A query or path parameter of the wrong type (``?limit=abc``): 400 naming it, not FastAPI's 422 shape."""
        first = (exc.errors() or [{}])[0]
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        error = ApiError(
            400, f"Invalid parameter {param!r}: {first.get('msg', 'invalid value')}", param=param, code="invalid_type"
        )
        status, body, headers = dialect_of(request).error(error, None)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", None)
        log.exception("unexpected error", extra={"request_id": request_id} if request_id else None)
        error = ApiError(500, "The server had an error while processing the request", type=ErrorType.SERVER)
        return answer(request, error, OutcomeLabel.INTERNAL_ERROR)

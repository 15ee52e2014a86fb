"""HTTP routes of Anthropic's Message Batches (``/v1/messages/batches``). Thin: authenticate as the Messages API
does (``x-api-key`` or ``Authorization``, then ``anthropic-version``), stream or parse, call the
:class:`~llmq_api.batch_jobs.message_batches.MessageBatches` on ``app.state.message_batches`` (wired by the pod),
render; errors are Anthropic's."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from llmq_api import anthropic_format, validation
from llmq_api.auth import Principal
from llmq_api.batch_jobs import message_render
from llmq_api.batch_jobs.message_batches import MessageBatches
from llmq_api.bodies import stream_body
from llmq_jobs.jobs import JobView

router = APIRouter()
RESULTS_MEDIA_TYPE = "application/x-jsonl"


def _service(request: Request) -> MessageBatches:
    return request.app.state.message_batches


def _caller(request: Request) -> Principal:
    request.state.dialect = anthropic_format.ANTHROPIC_DIALECT
    return anthropic_format.authenticate(request.app.state.keys, request.headers)


def _batch(request: Request, job: JobView) -> dict:
    """The ``message_batch`` object, its ``results_url`` absolute: the public base URL, else the request's own."""
    base = _service(request).settings.api.public_base_url.rstrip("/") or str(request.base_url).rstrip("/")
    return message_render.message_batch(job, f"{base}/v1/messages/batches/{job.spec.id}/results")


@router.post("/v1/messages/batches")
async def create_message_batch(request: Request) -> dict:
    principal = _caller(request)
    validation.check_content_type(request.headers.get("content-type"))
    limit_bytes = _service(request).settings.jobs.message_batch_max_body_bytes
    return _batch(request, await _service(request).create(principal, stream_body(request, limit_bytes)))


@router.get("/v1/messages/batches")
async def list_message_batches(
    request: Request, before_id: str | None = None, after_id: str | None = None, limit: int = 20
) -> dict:
    batches, has_more = await _service(request).list(_caller(request), before_id, after_id, limit)
    data = [_batch(request, job) for job in batches]
    return {
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


@router.get("/v1/messages/batches/{batch_id}")
async def get_message_batch(batch_id: str, request: Request) -> dict:
    return _batch(request, await _service(request).get(_caller(request), batch_id))


@router.post("/v1/messages/batches/{batch_id}/cancel")
async def cancel_message_batch(batch_id: str, request: Request) -> dict:
    return _batch(request, await _service(request).cancel(_caller(request), batch_id))


@router.delete("/v1/messages/batches/{batch_id}")
async def delete_message_batch(batch_id: str, request: Request) -> dict:
    await _service(request).delete(_caller(request), batch_id)
    return {"id": batch_id, "type": "message_batch_deleted"}


@router.get("/v1/messages/batches/{batch_id}/results")
async def message_batch_results(batch_id: str, request: Request) -> StreamingResponse:
    lines = await _service(request).results(_caller(request), batch_id)
    return StreamingResponse(lines, media_type=RESULTS_MEDIA_TYPE)

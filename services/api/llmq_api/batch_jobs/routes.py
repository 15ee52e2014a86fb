"""HTTP routes of ``/v1/files`` and ``/v1/batches`` (OpenAI-compatible). Thin: authenticate, parse, call the
:class:`~llmq_api.batch_jobs.files.BatchFiles` on ``app.state.batch_files`` or the
:class:`~llmq_api.batch_jobs.batches.BatchJobs` on ``app.state.batch_jobs`` (wired by the pod), render."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.datastructures import UploadFile

from llmq_api import idempotency, validation
from llmq_api.auth import Principal
from llmq_api.batch_jobs import expiry, render
from llmq_api.batch_jobs.batches import BatchJobs
from llmq_api.batch_jobs.files import BatchFiles
from llmq_api.errors import ApiError, invalid
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY
from llmq_core.status import ErrorCode

router = APIRouter()

MULTIPART_OVERHEAD_BYTES = 64 * 1024
MAX_BATCH_BODY_BYTES = 64 * 1024


def _files(request: Request) -> BatchFiles:
    return request.app.state.batch_files


def _jobs(request: Request) -> BatchJobs:
    return request.app.state.batch_jobs


def _principal(request: Request) -> Principal:
    return request.app.state.keys.authenticate(request.headers.get("authorization"))


async def _small_body(request: Request) -> bytes:
    body = await request.body()
    if len(body) > MAX_BATCH_BODY_BYTES:
        raise ApiError(
            413,
            f"Request body is larger than the limit of {MAX_BATCH_BODY_BYTES} bytes",
            code=ErrorCode.REQUEST_TOO_LARGE,
        )
    return body


# --- limits ---------------------------------------------------------------------------------------------------------


@router.get("/v1/limits")
async def limits(request: Request) -> dict:
    """The batch limits of this deployment, so a client can shard a large job to fit (``llmq batch run`` reads them;
    an API without this route gets OpenAI's limits): ``/v1/batches``' and ``/v1/messages/batches``'."""
    _principal(request)
    settings = _jobs(request).settings
    return {
        "object": "limits",
        "batch": {
            "max_requests": settings.jobs.batch_max_lines,
            "max_file_bytes": settings.jobs.files_max_bytes,
            "max_line_bytes": settings.jobs.batch_max_line_bytes,
            "max_completion_window_s": settings.jobs.batch_max_window_s,
        },
        "message_batch": {
            "max_requests": settings.jobs.message_batch_max_requests,
            "max_body_bytes": settings.jobs.message_batch_max_body_bytes,
            "max_request_bytes": settings.jobs.batch_max_line_bytes,
            "expires_after_s": settings.jobs.message_batch_expiry_s,
        },
    }


def _page(data: list[dict], has_more: bool) -> dict:
    """One page of a list, shaped as OpenAI's cursor-paginated lists."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


# --- files ------------------------------------------------------------------------------------------------------------


@router.post("/v1/files")
async def create_file(request: Request) -> dict:
    principal = _principal(request)
    service = _files(request)
    limit_bytes = service.settings.jobs.files_max_bytes + MULTIPART_OVERHEAD_BYTES
    declared = validation.bounded_int(request.headers.get("content-length", "").strip(), limit_bytes + 1)
    if declared is not None and declared > limit_bytes:
        raise ApiError(
            413,
            f"File is larger than the limit of {service.settings.jobs.files_max_bytes} bytes",
            param="file",
            code="file_too_large",
        )
    await service.admit_upload(principal)
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise ApiError(
            415, "Upload files as multipart/form-data with fields 'file' and 'purpose'", code="unsupported_media_type"
        )
    async with request.form(max_files=1, max_fields=8) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise invalid("'file' is required (a multipart file field)", param="file")
        if not isinstance(purpose, str):
            raise invalid("'purpose' is required", param="purpose")
        expires_after_s = expiry.form_seconds(form)
        record = await service.upload(principal, upload.filename or "", purpose, upload.file, expires_after_s)
    return render.file_object(record)


@router.get("/v1/files")
async def list_files(
    request: Request, purpose: str | None = None, after: str | None = None, limit: int = 100, order: str = "desc"
) -> dict:
    records, has_more = await _files(request).list_files(_principal(request), purpose, after, limit, order)
    return _page([render.file_object(r) for r in records], has_more)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request) -> dict:
    return render.file_object(await _files(request).get_file(_principal(request), file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> StreamingResponse:
    chunks = await _files(request).content(_principal(request), file_id)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict:
    await _files(request).delete_file(_principal(request), file_id)
    return {"id": file_id, "object": "file", "deleted": True}


# --- batches ----------------------------------------------------------------------------------------------------------


@router.post("/v1/batches")
async def create_batch(request: Request) -> dict:
    principal = _principal(request)
    key = idempotency.parse_key(request.headers.get(HTTP_IDEMPOTENCY_KEY))
    job = await _jobs(request).create(principal, await _small_body(request), key)
    return render.batch_object(job)


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> dict:
    jobs, has_more = await _jobs(request).list(_principal(request), after, limit)
    return _page([render.batch_object(job) for job in jobs], has_more)


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request) -> dict:
    return render.batch_object(await _jobs(request).get(_principal(request), batch_id))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict:
    return render.batch_object(await _jobs(request).cancel(_principal(request), batch_id))

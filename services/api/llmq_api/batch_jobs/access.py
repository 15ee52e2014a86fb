"""Who may touch a batch-job object: the deferred class a key must have, one request per call from the tenant's
requests per minute, and the tenant an object belongs to (any other tenant gets the same 404 as for a missing one)."""

from __future__ import annotations

from llmq_api.auth import Principal
from llmq_api.errors import ApiError
from llmq_api.ratelimit import RateLimiter
from llmq_core.constants import DEFERRED
from llmq_core.requests import echo
from llmq_core.status import ErrorCode, ErrorType
from llmq_jobs.jobs import FileRecord
from llmq_jobs.store import FileIndex


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind}: {echo(object_id)}", param="id", code="not_found")


def check_deferred(principal: Principal, action: str) -> None:
    """403 for a key that may not use the deferred class (batches run in it; files only feed batches)."""
    if DEFERRED not in principal.classes:
        raise ApiError(
            403,
            f"This API key may not use the deferred class that batches run in, so it may not {action}",
            type=ErrorType.PERMISSION,
            code=ErrorCode.CLASS_NOT_ALLOWED,
        )


async def take_request(limiter: RateLimiter, principal: Principal) -> None:
    """One request from the tenant's requests per minute: files and batches count like generation requests."""
    rejection = await limiter.acquire(principal, 0)
    if rejection is not None:
        raise rejection.error


async def owned_file(index: FileIndex, principal: Principal, file_id: str) -> FileRecord:
    """The tenant's file ``file_id``; 404 when there is none or it is another tenant's."""
    record = await index.get_file(file_id)
    if record is None or record.tenant_id != principal.tenant_id:
        raise not_found("file", file_id)
    return record

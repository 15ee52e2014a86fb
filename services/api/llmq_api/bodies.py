"""Reading request bodies within a byte limit: whole (a generation request) or as they arrive (a Message Batch's
create body, which may be far larger than any one request)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from llmq_api import validation
from llmq_api.errors import ApiError
from llmq_api.openai_format import CLIENT_GONE_STATUS


async def stream_body(request: Request, limit_bytes: int) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; 413 as soon as it is known to exceed ``limit_bytes`` (its
    ``content-length`` first), 499 when the client leaves while sending it."""
    validation.check_declared_length(request.headers.get("content-length"), limit_bytes)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit_bytes:
                raise validation.too_large(limit_bytes)
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise ApiError(
            CLIENT_GONE_STATUS, "The client disconnected while sending the body", code="client_disconnected"
        ) from None


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The whole body, as :func:`stream_body` reads it."""
    return b"".join([chunk async for chunk in stream_body(request, limit_bytes)])

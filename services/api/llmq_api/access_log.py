"""One access-log line per HTTP request: method and route, status, tenant, request id, latency.

Never a body: prompts and answers stay out of the logs. The tenant is looked up from the request's API key (one
SHA-256, as the handler does; ``-`` without a valid key), the request id from the ``x-request-id`` response header
(``-`` where a route sets none), the latency runs to the last byte sent (a stream's whole life).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llmq_core.constants import HTTP_REQUEST_ID

log = logging.getLogger("llmq_api.access")

_REQUEST_ID_HEADER = HTTP_REQUEST_ID.encode()


class AccessLog:
    """ASGI middleware: logs each HTTP request once it has ended (also when its handler raised)."""

    def __init__(self, app, tenant_of: Callable[[str | None], str | None]) -> None:
        """``tenant_of``: an ``Authorization`` header value -> its tenant, or None."""
        self.app = app
        self.tenant_of = tenant_of

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen = {"status": 500, "request_id": "-"}  # unanswered (the server failed): counted as a 500

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == _REQUEST_ID_HEADER:
                        seen["request_id"] = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            authorization = _header(scope, b"authorization")
            log.info(
                "%s %s %d tenant=%s latency_ms=%.1f",
                scope["method"],
                scope["path"],
                seen["status"],
                self.tenant_of(authorization) or "-",
                (time.perf_counter() - started) * 1000,
                extra={"request_id": seen["request_id"]},
            )


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None

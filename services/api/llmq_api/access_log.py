"""One access-log record per HTTP request, its parts as separate JSON fields: ``method``, ``route``, ``status``,
``tenant``, ``request_id``, ``latency_ms``; the message is the fixed ``http request``.

``route`` is the template of the route that matched (``/v1/files/{file_id}``), :data:`NO_ROUTE` when none did: never
the request's path, whose decoded bytes the client chooses (a path spelling ``200 tenant=victim`` and a newline once
read as another tenant's request). Never a body either: prompts and answers stay out of the logs. The tenant is looked
up from the request's API key (one SHA-256, as the handler does; ``-`` without a valid key), the request id from the
``x-request-id`` response header (``-`` where a route sets none), the latency runs to the last byte sent (a stream's
whole life).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llmq_core.constants import HTTP_REQUEST_ID

log = logging.getLogger("llmq_api.access")

MESSAGE = "http request"
NO_ROUTE = "(no route)"  # the route field of a request no route matched (a 404, or a redirect to add a slash)

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
            fields = {
                "method": scope["method"],
                "route": route_of(scope),
                "status": seen["status"],
                "tenant": self.tenant_of(_header(scope, b"authorization")) or "-",
                "request_id": seen["request_id"],
                "latency_ms": round((time.perf_counter() - started) * 1000, 1),
            }
            log.info(MESSAGE, extra=fields)


def route_of(scope) -> str:
    """The template of the route that served ``scope`` (Starlette's ``scope["route"]``), else :data:`NO_ROUTE`."""
    return getattr(scope.get("route"), "path_format", None) or NO_ROUTE


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None

"""The generation routes' short way through the app: ``POST /v1/completions`` and ``/v1/chat/completions`` go from the
access log straight to their handler, past Starlette's middleware and routing layers (seven ASGI layers, each a
coroutine and most a ``send`` wrapper per request: about a tenth of a pod's CPU per request at saturation). What those
layers do for these routes is done here the same way: an exception before the response started is answered by the
app's handler for its type (the ``Exception`` one, a 500, is then re-raised, as Starlette's ServerErrorMiddleware does
so the server logs it); one after is re-raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


class HotRoutesApp(FastAPI):
    """FastAPI, with :attr:`hot_routes` (path -> the Starlette route of its POST handler, see :meth:`add_hot_route`)
    served by :func:`hot_route`; everything else, and every request while a wrapping middleware (tracing) must see it,
    by FastAPI. Set ``hot_stack`` (the access log around :meth:`serve_hot`, or :meth:`serve_hot` itself) before
    serving."""

    hot_routes: Mapping[str, Route] = {}
    hot_stack: ASGIApp | None = None

    def add_hot_route(self, path: str, endpoint: Endpoint) -> None:
        """Serve ``POST path`` with ``endpoint``: a plain Starlette route, taken the short way while ``hot_stack``
        is set."""
        self.add_route(path, endpoint, methods=["POST"])
        (route,) = [r for r in self.router.routes if isinstance(r, Route) and r.path == path]
        self.hot_routes = {**self.hot_routes, path: route}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot_stack is not None and scope["type"] == "http" and scope["path"] in self.hot_routes:
            if scope["method"] == "POST":
                scope["app"] = self
                scope["route"] = self.hot_routes[scope["path"]]  # as Starlette's router notes it (the access log)
                await self.hot_stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def serve_hot(self, scope: Scope, receive: Receive, send: Send) -> None:
        await hot_route(scope["route"].endpoint, self.exception_handlers, scope, receive, send)


async def hot_route(
    endpoint: Endpoint, handlers: Mapping[type, Callable], scope: Scope, receive: Receive, send: Send
) -> None:
    """Run ``endpoint`` and its response; an exception is answered as Starlette's exception layers would."""
    request = Request(scope, receive, send)
    started = False

    async def sending(message: Message) -> None:
        nonlocal started
        started = True
        await send(message)

    try:
        response = await endpoint(request)
        await response(scope, receive, sending)
    except Exception as exc:
        if started:
            raise
        handler = next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers), None)
        if handler is None:
            raise
        await (await handler(request, exc))(scope, receive, send)
        if handler is handlers.get(Exception):
            raise

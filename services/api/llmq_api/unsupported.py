"""What llmq does not serve, in one table: OpenAI's routes it has no engine for get a 404 naming what is missing
(OpenAI's shape; docs/api.md "Not supported"), any other unknown route OpenAI's ``Invalid URL`` 404."""

from __future__ import annotations

from llmq_api.errors import ApiError

DOCS = "docs/api.md#not-supported"
# path prefix -> what it is (OpenAI's API families llmq has no engine for: its workers generate text only)
UNSUPPORTED_ROUTES = {
    "/v1/embeddings": "embeddings",
    "/v1/images/": "image generation and editing",
    "/v1/audio/": "audio (speech, transcriptions, translations)",
    "/v1/moderations": "moderations",
    "/v1/responses": "the Responses API (use /v1/chat/completions)",
}


def unsupported_route(path: str) -> str | None:
    """What ``path`` asks for when it is one of the families llmq does not serve; None otherwise."""
    for prefix, what in UNSUPPORTED_ROUTES.items():
        if path == prefix.rstrip("/") or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return what
    return None


def not_found(method: str, path: str) -> ApiError:
    """The 404 of a route llmq does not have."""
    what = unsupported_route(path)
    if what is None:
        return ApiError(404, f"Invalid URL ({method} {path[:200]})")
    return ApiError(
        404,
        f"This server does not support {what}: llmq serves text generation only ({method} {path[:200]}; see {DOCS})",
        code="unsupported_endpoint",
    )

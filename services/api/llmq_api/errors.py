"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

from collections.abc import Mapping

from redis.exceptions import ResponseError

from llmq_core.api_formats import error_body
from llmq_core.constants import HTTP_RETRY_AFTER, HTTP_SHOULD_RETRY
from llmq_core.requests import RequestError
from llmq_core.status import ErrorCode, ErrorType

RETRY_AFTER_S = 1  # what 429/503 answers tell clients to wait
STORE_FULL_RETRY_AFTER_S = 5  # Redis refuses writes (maxmemory): TTLs and evictions free room in seconds, not ms
STORE_UNAVAILABLE = "store_unavailable"
RETRYABLE_STATUSES = frozenset({429, 503})  # overload and unavailability pass; a deadline, a client mistake do not


class ApiError(RequestError):
    """A request's terminal error as the client sees it: a :class:`~llmq_core.requests.RequestError` (``status``,
    message, type, ``param``: the offending request field or header, ``code``) with ``headers``, extra response headers
    such as ``retry-after``, and ``retryable``, whether the same request may succeed later (default: the status is 429
    or 503).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = ErrorType.INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(status, message, param=param, code=code, type=type)
        self.headers = dict(headers or {})
        self.retryable = status in RETRYABLE_STATUSES if retryable is None else retryable

    def response_headers(self) -> dict[str, str]:
        """``headers`` plus ``x-should-retry`` (OpenAI's SDKs obey it over their own status rules) and, when a retry
        can help, a ``retry-after`` (1 s unless set)."""
        headers = {**self.headers, HTTP_SHOULD_RETRY: "true" if self.retryable else "false"}
        if self.retryable:
            headers.setdefault(HTTP_RETRY_AFTER, str(RETRY_AFTER_S))
        return headers

    def body(self) -> dict:
        """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}`` (param/code may be None)."""
        return error_body(self)

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def invalid(message: str, param: str | None = None, code: str = ErrorCode.INVALID_VALUE) -> ApiError:
    """A 400 ``invalid_request_error`` (``invalid_value`` unless a closer code says more)."""
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str, retry_after_s: int, code: str = "service_unavailable") -> ApiError:
    """A 503 the client should retry after ``retry_after_s`` seconds."""
    return ApiError(503, message, type=ErrorType.SERVER, code=code, headers={HTTP_RETRY_AFTER: str(retry_after_s)})


def store_unavailable(exc: Exception) -> ApiError:
    """The 503 for a request that needs Redis when Redis refuses the write (``exc`` a ResponseError: maxmemory) or
    cannot be reached. Raised before anything is produced, so the request did not run: the client retries it."""
    full = isinstance(exc, ResponseError)
    state = "full" if full else "unreachable"
    return unavailable(
        f"The request store is {state} right now; nothing was queued. Retry later.",
        STORE_FULL_RETRY_AFTER_S if full else RETRY_AFTER_S,
        code=STORE_UNAVAILABLE,
    )

"""Validation of a batch input file (OpenAI batch JSONL), per line, before anything is queued. Pure: no I/O.

Each line is ``{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>, "body": {...}}``. Line numbers
count physical lines from 1; blank lines are skipped, CRLF line ends and a leading UTF-8 BOM are accepted.

Structural faults (not JSON, custom_id rules, duplicates, method/url not matching the endpoint, no body object,
limits) fail the whole batch with OpenAI's ``errors.data`` entries. A well-formed line whose body then fails the
endpoint's own validation (:mod:`llmq_api.validation`) is kept as an errored line of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmq_api import validation
from llmq_api.anthropic_messages import parse_messages
from llmq_api.errors import ApiError
from llmq_core import structured
from llmq_core.requests import echo
from llmq_core.token_counts import TokenCounter
from llmq_jobs import jobs

BOM = b"\xef\xbb\xbf"
MAX_REPORTED_ERRORS = 100  # errors.data entries kept; the count of the rest is reported in the last one


class _Line(msgspec.Struct, kw_only=True):
    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: msgspec.Raw = msgspec.Raw(b"")  # kept raw: the endpoint's own validation parses it


@dataclass(frozen=True, slots=True)
class Limits:
    max_lines: int
    max_line_bytes: int
    max_stop_bytes: int = validation.DEFAULT_MAX_STOP_BYTES  # per stop sequence, as over HTTP
    counters: Mapping[str, TokenCounter] = field(default_factory=dict)  # model -> its tokenizer, as over HTTP
    max_schema_bytes: int = structured.DEFAULT_MAX_SCHEMA_BYTES  # a chat line's response_format or tools, as over HTTP


@dataclass(frozen=True, slots=True)
class InputLine:
    """A structurally valid line: its request (``valid``) or the body's own error (``error``)."""

    line: int
    custom_id: str
    model: str
    valid: validation.ValidRequest | None = None
    error: ApiError | None = None


@dataclass
class CheckedInput:
    """Every structurally valid line in file order, and the structural errors (empty: the batch may run)."""

    lines: list[InputLine] = field(default_factory=list)
    errors: list[jobs.LineError] = field(default_factory=list)
    error_count: int = 0

    def fail(self, code: str, message: str, param: str | None = None, line: int | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(jobs.LineError(code=code, message=message, param=param, line=line))

    def reported_errors(self) -> list[jobs.LineError]:
        """The kept errors, plus one that counts those left out."""
        left_out = self.error_count - len(self.errors)
        if left_out <= 0:
            return list(self.errors)
        return [*self.errors, jobs.LineError(code="too_many_errors", message=f"{left_out} more errors not listed")]


class InputChecker:
    """Checks an input file line by line as it streams in: :meth:`feed` its chunks in order, then :meth:`end`. Each
    returns the structurally valid lines completed so far; ``checked`` gathers the errors (its ``lines`` stay empty).
    It keeps at most one line of the file (``max_line_bytes``) and the custom_ids seen; ``stopped`` turns True once
    the file has too many lines (the rest need not be read)."""

    def __init__(self, endpoint: str, models: Mapping[str, int], limits: Limits) -> None:
        self.endpoint, self.models, self.limits = endpoint, models, limits
        self.checked = CheckedInput()
        self.stopped = False
        self._seen: set[str] = set()
        self._count = 0  # request lines (not blank)
        self._number = 0  # physical lines
        self._buffer = bytearray()
        self._skipped = 0  # bytes of a line too long to keep

    def feed(self, chunk: bytes) -> list[InputLine]:
        out: list[InputLine] = []
        start = 0
        while not self.stopped:
            end = chunk.find(b"\n", start)
            self._take(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                break
            out += self._line()
            start = end + 1
        return out

    def end(self) -> list[InputLine]:
        """The last line (one without a line end), and the empty file's error."""
        out = self._line() if (self._buffer or self._skipped) and not self.stopped else []
        if self._count == 0:
            self.checked.fail("empty_file", "The input file has no requests")
        return out

    def _take(self, piece: bytes) -> None:
        if self._skipped or len(self._buffer) + len(piece) > self.limits.max_line_bytes + 1:  # + 1: a CR
            self._skipped += len(self._buffer) + len(piece)
            self._buffer.clear()
        else:
            self._buffer += piece

    def _line(self) -> list[InputLine]:
        self._number += 1
        raw, skipped = bytes(self._buffer).removesuffix(b"\r"), self._skipped
        self._buffer.clear()
        self._skipped = 0
        if self._number == 1:
            raw = raw.removeprefix(BOM)
        if not skipped and not raw.strip():
            return []
        return self._request(raw, skipped)

    def check(self, raw: bytes) -> list[InputLine]:
        """One whole request line (a Message Batch's request, as an input line): the next line number."""
        self._number += 1
        return self._request(raw, 0)

    def _request(self, raw: bytes, skipped: int) -> list[InputLine]:
        self._count += 1
        limits = self.limits
        if self._count > limits.max_lines:
            self.checked.fail(
                "too_many_lines", f"The file has more than {limits.max_lines} requests", line=self._number
            )
            self.stopped = True
            return []
        size = skipped or len(raw)
        if size > limits.max_line_bytes:
            self.checked.fail(
                "line_too_large", f"Line is {size} bytes; the limit is {limits.max_line_bytes}", line=self._number
            )
            return []
        line = _check_line(raw, self._number, self.endpoint, self.models, self._seen, self.checked, limits)
        return [] if line is None else [line]


def check_input(data: bytes, endpoint: str, models: Mapping[str, int], limits: Limits) -> CheckedInput:
    """Validate a whole input file held in memory for ``endpoint`` (an OpenAI path such as ``/v1/chat/completions``);
    :class:`InputChecker` does the same as the file streams in. ``models`` maps served model names to context
    windows (see :mod:`llmq_api.validation`)."""
    checker = InputChecker(endpoint, models, limits)
    checker.checked.lines = checker.feed(data) + checker.end()
    return checker.checked


def _check_line(
    raw: bytes,
    number: int,
    endpoint: str,
    models: Mapping[str, int],
    seen: set[str],
    checked: CheckedInput,
    limits: Limits,
) -> InputLine | None:
    try:
        line = msgspec.json.decode(raw, type=_Line)
    except msgspec.ValidationError:
        checked.fail("invalid_json_line", "Line is not a JSON object", line=number)
        return None
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        checked.fail("invalid_json_line", f"Line is not valid JSON: {exc}", line=number)
        return None
    custom_id = line.custom_id
    if custom_id is None:
        checked.fail("missing_custom_id", "Line has no custom_id", param="custom_id", line=number)
        return None
    if not isinstance(custom_id, str) or not jobs.CUSTOM_ID_RE.fullmatch(custom_id):
        checked.fail(
            "invalid_custom_id",
            f"custom_id must be 1-64 characters of letters, digits, '-' and '_', got {echo(custom_id)}",
            param="custom_id",
            line=number,
        )
        return None
    if custom_id in seen:
        checked.fail(
            "duplicate_custom_id",
            f"custom_id {echo(custom_id)} is used by an earlier line",
            param="custom_id",
            line=number,
        )
        return None
    seen.add(custom_id)
    if line.method != "POST":
        checked.fail("invalid_method", f"method must be POST, got {echo(line.method)}", param="method", line=number)
        return None
    if line.url != endpoint:
        checked.fail(
            "mismatched_url",
            f"url must be the batch's endpoint {endpoint}, got {echo(line.url)}",
            param="url",
            line=number,
        )
        return None
    body = bytes(line.body)
    if not body.lstrip().startswith(b"{"):
        checked.fail("invalid_body", "body must be a JSON object with the request", param="body", line=number)
        return None
    return _check_body(body, number, custom_id, endpoint, models, limits)


def _check_body(
    body: bytes, number: int, custom_id: str, endpoint: str, models: Mapping[str, int], limits: Limits
) -> InputLine:
    try:
        if endpoint == jobs.MESSAGES_ENDPOINT:
            valid = parse_messages(
                body,
                models,
                max_stop_bytes=limits.max_stop_bytes,
                counters=limits.counters,
                max_schema_bytes=limits.max_schema_bytes,
            )
        else:
            valid = validation.parse(
                jobs.BATCH_ENDPOINTS[endpoint],
                body,
                models,
                max_stop_bytes=limits.max_stop_bytes,
                counters=limits.counters,
                max_schema_bytes=limits.max_schema_bytes,
            )
    except ApiError as exc:
        return InputLine(line=number, custom_id=custom_id, model=_model_of(body), error=exc)
    if valid.stream:
        error = ApiError(400, "'stream' is not supported in a batch", param="stream", code="unsupported_parameter")
        return InputLine(line=number, custom_id=custom_id, model=valid.model, error=error)
    return InputLine(line=number, custom_id=custom_id, model=valid.model, valid=valid)


def _model_of(body: bytes) -> str:
    try:
        model = msgspec.json.decode(body, type=dict).get("model")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ""
    return model if isinstance(model, str) else ""

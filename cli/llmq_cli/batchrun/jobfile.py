"""The job file: one OpenAI batch request per line. Checked whole before anything is uploaded; lines are kept as byte
ranges of the file (not in memory), and each shard's upload lines are rebuilt from them when it is uploaded."""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass
from pathlib import Path

from llmq_jobs.jobs import CUSTOM_ID_RE

MAX_PROBLEMS_KEPT = 1000  # a job with more offenders lists these; the count is still exact


@dataclass(frozen=True, slots=True)
class JobLine:
    """One request of the job: its physical line ``number`` (from 1), where it lies in the file, its custom_id and
    the size of its upload line (the exact bytes it adds to a shard's file, newline included)."""

    number: int
    offset: int
    length: int
    custom_id: str
    upload_bytes: int


@dataclass(frozen=True, slots=True)
class Problem:
    line: int
    message: str


@dataclass(frozen=True, slots=True)
class Job:
    path: Path
    endpoint: str
    lines: list[JobLine]
    digest: str  # sha256 of the file and the id template: a rerun must be the same job


class JobFileError(ValueError):
    """The job cannot run: every offending line (up to MAX_PROBLEMS_KEPT) with its number, plus the count."""

    def __init__(self, problems: list[Problem], count: int) -> None:
        self.problems, self.count = problems, count
        super().__init__(f"{count} line(s) of the job are refused")


class IdTemplate:
    """Builds a custom_id from fields of a line, e.g. ``{doc_id}-{prompt_version}`` or ``{metadata.doc}-v2``:
    ``str.format`` fields name keys of the line's JSON object, dotted for nested objects."""

    def __init__(self, template: str) -> None:
        self._parts = list(string.Formatter().parse(template))
        names = [name for _, name, _, _ in self._parts if name is not None]
        if not names or not all(names):
            raise ValueError(f"--id-template needs named fields such as {{doc_id}}, got {template!r}")
        self.template = template

    def render(self, line: dict) -> str:
        """The id of ``line``; ValueError when a field is missing or not a string or number."""
        return "".join(
            literal + (format(_lookup(line, name), spec or "") if name is not None else "")
            for literal, name, spec, _ in self._parts
        )


def _lookup(line: dict, dotted: str) -> str:
    value: object = line
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"field {dotted!r} of --id-template is missing")
        value = value[part]
    if isinstance(value, (dict, list)) or value is None:
        raise ValueError(f"field {dotted!r} of --id-template is not a string or number")
    return str(value)


def upload_line(request: dict, custom_id: str) -> bytes:
    """The line as uploaded: exactly the four fields of OpenAI's batch format (extra fields of the job stay home)."""
    line = {"custom_id": custom_id, "method": "POST", "url": request["url"], "body": request["body"]}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def custom_id_problem(custom_id: object) -> str | None:
    if not isinstance(custom_id, str) or not CUSTOM_ID_RE.fullmatch(custom_id):
        return f"custom_id must be 1-64 characters of [A-Za-z0-9_-], got {json.dumps(custom_id)[:80]}"
    return None


def _request_of(raw: bytes, template: IdTemplate | None) -> tuple[dict, str]:
    """``(request, custom_id)`` of one line; ValueError says what is wrong with it."""
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a JSON object: {exc}") from exc
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    if not isinstance(request.get("url"), str):
        raise ValueError("url (the endpoint, e.g. /v1/chat/completions) is missing")
    if not isinstance(request.get("body"), dict):
        raise ValueError("body (a JSON object) is missing")
    if request.get("method", "POST") != "POST":
        raise ValueError("method must be POST")
    custom_id = template.render(request) if template else request.get("custom_id")
    problem = custom_id_problem(custom_id)
    if problem:
        raise ValueError(problem)
    return request, custom_id


def read_job(path: Path, template: IdTemplate | None = None) -> Job:
    """Every line checked (JSON object, url, body, custom_id shape, unique custom_ids, one endpoint) before anything
    is uploaded; raises JobFileError with the offenders' line numbers."""
    lines: list[JobLine] = []
    problems: list[Problem] = []
    count = 0
    seen: dict[str, int] = {}
    endpoint = ""
    digest = hashlib.sha256((template.template if template else "").encode() + b"\0")

    def refuse(number: int, message: str) -> None:
        nonlocal count
        count += 1
        if len(problems) < MAX_PROBLEMS_KEPT:
            problems.append(Problem(number, message))

    with path.open("rb") as source:
        offset = 0
        for number, raw in enumerate(source, start=1):
            digest.update(raw)
            start, offset = offset, offset + len(raw)
            text = raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw
            if not text.strip():
                continue
            try:
                request, custom_id = _request_of(text, template)
            except ValueError as exc:
                refuse(number, str(exc))
                continue
            endpoint = endpoint or request["url"]
            if request["url"] != endpoint:
                refuse(number, f"url {request['url']!r} differs from the job's endpoint {endpoint!r}")
            elif custom_id in seen:
                refuse(number, f"custom_id {custom_id!r} repeats line {seen[custom_id]}")
            else:
                seen[custom_id] = number
                size = len(upload_line(request, custom_id))
                lines.append(JobLine(number, start, len(raw), custom_id, size))
    if not lines and not count:
        refuse(0, "the job has no request lines")
    if count:
        raise JobFileError(problems, count)
    return Job(path, endpoint, lines, digest.hexdigest())


def shard_file(job: Job, lines: list[JobLine], template: IdTemplate | None) -> bytes:
    """The upload file of the shard holding ``lines``: each rebuilt from the job file exactly as when it was sized."""
    parts = []
    with job.path.open("rb") as source:
        for line in lines:
            source.seek(line.offset)
            raw = source.read(line.length)
            text = raw.removeprefix(b"\xef\xbb\xbf") if line.offset == 0 else raw
            request, custom_id = _request_of(text, template)
            parts.append(upload_line(request, custom_id))
    return b"".join(parts)

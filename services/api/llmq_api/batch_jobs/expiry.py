"""OpenAI's expiration policies: an upload's ``expires_after`` and a batch's ``output_expires_after`` (its output and
error files), each ``{"anchor": "created_at", "seconds": 3600..2592000}``. Honoured (the file is swept that long after
it is created, at most ``LLMQ_FILES_RETENTION_S``), or refused with a 400 naming the field."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from llmq_api.errors import invalid
from llmq_core.status import ErrorCode
from llmq_jobs import jobs

FILE_PARAM = "expires_after"
OUTPUT_PARAM = "output_expires_after"


class ExpiresAfter(msgspec.Struct, kw_only=True):
    """A JSON body's expiration policy (a field of another type is a 400 naming it, as every body field)."""

    anchor: str
    seconds: int


def policy_seconds(policy: ExpiresAfter | None, param: str) -> int | None:
    """The seconds of ``policy`` (None without one); a 400 naming ``<param>.anchor`` or ``<param>.seconds`` for one
    OpenAI refuses."""
    if policy is None:
        return None
    wrong = jobs.check_expiry(policy.anchor, policy.seconds)
    if wrong is not None:
        field, message = wrong
        raise invalid(f"{param}.{message}", param=f"{param}.{field}")
    return policy.seconds


def form_seconds(form: Mapping[str, object]) -> int | None:
    """An upload's ``expires_after``, as the OpenAI SDKs send it in a multipart form: the fields
    ``expires_after[anchor]`` and ``expires_after[seconds]``."""
    if FILE_PARAM in form:
        raise invalid(
            f"{FILE_PARAM} is sent as the form fields {FILE_PARAM}[anchor] and {FILE_PARAM}[seconds]", param=FILE_PARAM
        )
    anchor, seconds = form.get(f"{FILE_PARAM}[anchor]"), form.get(f"{FILE_PARAM}[seconds]")
    if anchor is None and seconds is None:
        return None
    for field, value in (("anchor", anchor), ("seconds", seconds)):
        if value is None:
            raise invalid(
                f"{FILE_PARAM}[{field}] is required with an {FILE_PARAM}",
                param=f"{FILE_PARAM}.{field}",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            )
        if not isinstance(value, str):
            raise invalid(f"{FILE_PARAM}[{field}] must be a form field, not a file", param=f"{FILE_PARAM}.{field}")
    text = seconds.strip()  # type: ignore[union-attr]
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else seconds  # else refused as it came
    return policy_seconds(ExpiresAfter(anchor=anchor, seconds=number), FILE_PARAM)  # type: ignore[arg-type]

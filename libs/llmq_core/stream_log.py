"""Resumable streams: which streams a worker logs chunk by chunk, and who holds one now.

A stream sent with an ``Idempotency-Key`` is *resumable*: its workers RPUSH every TokenChunk they publish to
``constants.stream_log_key(request_id)`` (before publishing it, at most ``worker.stream_log_max_bytes`` per run, kept
until the deadline plus a grace), so that a request with that key to any API pod can replay the stream while it runs
(``llmq_api.resume``). When its client leaves or its pod dies the stream keeps running for ``api.stream_resume_window_ms``;
a pod resuming it writes ``constants.stream_holder_key(request_id)`` = ``"<instance_id> <token>"``, and the window is
counted from the holder's leaving (its pod's, or the first pod's while no one resumed).
"""

from __future__ import annotations

from llmq_core import wire


def resumable(request: wire.GenerationRequest) -> bool:
    """Whether ``request`` is a stream to an API pod with an Idempotency-Key: one another pod can resume."""
    return request.stream and request.idempotency_key is not None and isinstance(request.reply_to, wire.HttpReply)


def holder_value(instance_id: str, token: str) -> str:
    """The value of a stream's holder key naming one connection (``token``) of pod ``instance_id``."""
    return f"{instance_id} {token}"


def holder_pod(value: bytes | str | None) -> str | None:
    """The API pod a holder key's value names (None: no value, or not one :func:`holder_value` wrote)."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    pod, _, token = text.partition(" ")
    return pod if pod and token else None

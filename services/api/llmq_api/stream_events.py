"""The events of one stream as its client gets them: a resumable one's (sent with an Idempotency-Key) carry SSE
``id``s, and a resumed stream skips those its client already has. Other streams carry no ids (nothing could resume
them, and a client that splits events naively sees the bytes it always saw).

An event's id is the number of characters (Unicode code points) of generated text the stream holds once it is read,
over all choices: the opening's is 0, and ids only grow, over the whole request across its attempts and
continuations (the waiter passes each character once). So a client that kept the text knows its ``Last-Event-ID``
even when its library hides the ids (the OpenAI SDK does: ``len`` of the text it got). A stream resumed after id K
(``llmq_api.resume``) feeds the replayed chunks through the dialect's encoder as the first connection did, writing only
what comes after the first K characters. Of one choice those are always known; of several, the replay must have
reached K, since their order is the log's: if the log holds less (it keeps ``worker.stream_log_max_bytes`` per run),
the stream ends with ``stream_events_not_kept``, its result still stored.
"""

from __future__ import annotations

from collections.abc import Callable

from llmq_api.errors import ApiError, invalid
from llmq_core import wire
from llmq_core.constants import HTTP_IDEMPOTENCY_KEY, HTTP_LAST_EVENT_ID

MAX_EVENT_ID_DIGITS = 18  # more characters than any stream holds
Encoder = Callable[[int, str, list[wire.TokenLogprob] | None], bytes]


def with_id(data: bytes, event_id: int) -> bytes:
    """``data`` (whole SSE events) with ``id: event_id`` on its last event."""
    body = data[:-2] if data.endswith(b"\n\n") else data
    cut = body.rfind(b"\n\n")
    start = 0 if cut < 0 else cut + 2
    return b"%sid: %d\n%s" % (data[:start], event_id, data[start:])


def events_not_kept(request_id: str) -> ApiError:
    """A resume whose Last-Event-ID lies past the text its stream's log kept, of a request with several choices."""
    return ApiError(
        410,
        "The events of this stream after its Last-Event-ID were not kept; its result is at "
        f"GET /v1/requests/{request_id}",
        param=HTTP_LAST_EVENT_ID,
        code="stream_events_not_kept",
        retryable=False,
    )


class StreamEvents:
    """One stream's text events, with ids when ``ids``; ``last_event_id``: the id its client resumes after (None: it
    starts). :attr:`sent` is the text of each choice the client has (written now or before the resume)."""

    def __init__(self, encode: Encoder, last_event_id: int | None = None, *, ids: bool = True) -> None:
        self._encode = encode
        self._ids = ids
        self._resume_after = last_event_id
        self.sent: dict[int, str] = {}
        self.position = 0  # characters in sent
        self.written = False  # whether any text was written by this connection

    def opening(self, data: bytes) -> bytes:
        """What of the dialect's opening ``data`` to write: none when resuming (the client has it)."""
        if not data or self._resume_after is not None:
            return b""
        return self._with_id(data, 0)

    def text(self, index: int, text: str, logprobs: list[wire.TokenLogprob] | None = None) -> bytes:
        """What to write of new ``text`` of choice ``index``: b"" when the client has it already, or the dialect
        holds it back (then it is not counted as sent: the closing carries it)."""
        have = 0 if self._resume_after is None else max(0, self._resume_after - self.position)
        if have:
            head, text = text[:have], text[have:]
            self._count(index, head, self._encode(index, head, None if text else logprobs))
            if not text:
                return b""
        data = self._encode(index, text, logprobs)
        if not self._count(index, text, data):
            return b""
        self.written = True
        return self._with_id(data, self.position)

    def catch_up(self, result: wire.FinalResult) -> bool:
        """Count as sent the text of ``result`` the client has past what was replayed (a log that kept less than
        the resumed id); False when that is not known (several choices)."""
        missing = 0 if self._resume_after is None else self._resume_after - self.position
        if missing <= 0:
            return True
        if len(result.choices) != 1:
            return False
        choice = result.choices[0]
        have = self.sent.get(choice.index, "")
        self.text(choice.index, choice.text[len(have) : len(have) + missing])
        return True

    def closing(self, data: bytes, result: wire.FinalResult) -> bytes:
        """The dialect's closing ``data`` with the id of all of ``result``'s text."""
        return self._with_id(data, sum(len(choice.text) for choice in result.choices))

    def _with_id(self, data: bytes, event_id: int) -> bytes:
        return with_id(data, event_id) if self._ids else data

    def _count(self, index: int, text: str, data: bytes) -> bool:
        if not data or not text:
            return bool(data)
        self.sent[index] = self.sent.get(index, "") + text
        self.position += len(text)
        return True


def parse_last_event_id(value: str | None, *, keyed: bool, stream: bool) -> int | None:
    """The ``Last-Event-ID`` header of a request resuming a stream (None when absent); 400 unless a non-negative
    integer, sent with ``stream: true`` and the stream's Idempotency-Key."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_EVENT_ID_DIGITS):
        raise invalid(f"{HTTP_LAST_EVENT_ID} must be an event id of a stream (digits)", param=HTTP_LAST_EVENT_ID)
    if not (keyed and stream):
        raise invalid(
            f"{HTTP_LAST_EVENT_ID} resumes a stream: send it with stream true and the stream's {HTTP_IDEMPOTENCY_KEY}",
            param=HTTP_LAST_EVENT_ID,
        )
    return int(text)

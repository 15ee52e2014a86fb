"""OpenAI's two shapes of logprobs, from a choice's ``wire.TokenLogprob`` entries (whole choices here; a stream's
chunks in ``llmq_api.logprobs_format``, with the same functions).

- chat (``/v1/chat/completions``): ``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
  "refusal": null}``: the wire entries as they are.
- legacy completions (``/v1/completions``): ``{tokens, token_logprobs, top_logprobs, text_offset}``: per token its
  text, its log probability, a map of the most likely tokens (the alternatives asked for, and the chosen token) to
  theirs, and where it starts in the choice's text (characters from 0; a token that continues a character begun by the
  one before starts where that character does).
"""

from __future__ import annotations

import codecs

import msgspec

from llmq_core import wire


def chat_logprobs(entries: list[wire.TokenLogprob] | None) -> dict | None:
    if entries is None:
        return None
    return {"content": msgspec.to_builtins(entries), "refusal": None}


class TextOffsets:
    """Characters of a choice's text before each next token, fed the tokens' bytes in order."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._chars = 0

    def next(self, data: list[int]) -> int:
        start = self._chars
        self._chars += len(self._decoder.decode(bytes(data)))
        return start


def completion_logprobs(entries: list[wire.TokenLogprob] | None, offsets: TextOffsets | None = None) -> dict | None:
    """The legacy shape of ``entries``; ``offsets``: the choice's so far (a stream's; a new one for a whole choice)."""
    if entries is None:
        return None
    offsets = offsets or TextOffsets()
    top = []
    for e in entries:
        alternatives = {t.token: t.logprob for t in e.top_logprobs}
        alternatives.setdefault(e.token, e.logprob)
        top.append(alternatives)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": top,
        "text_offset": [offsets.next(e.bytes) for e in entries],
    }

"""A stream's logprobs, chunk by chunk, in OpenAI's shapes (:mod:`llmq_core.logprob_shapes`)."""

from __future__ import annotations

from llmq_core import wire
from llmq_core.logprob_shapes import TextOffsets, chat_logprobs, completion_logprobs


class StreamLogprobs:
    """What a stream has sent of each choice's entries, so its closing chunk sends the rest of the result's."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._sent: dict[int, int] = {}
        self._offsets: dict[int, TextOffsets] = {}

    def render(self, index: int, entries: list[wire.TokenLogprob] | None) -> dict | None:
        """The ``logprobs`` of the chunk of choice ``index`` that carries ``entries`` (None: not asked)."""
        if entries is None:
            return None
        self._sent[index] = self._sent.get(index, 0) + len(entries)
        if self._chat:
            return chat_logprobs(entries)
        return completion_logprobs(entries, self._offsets.setdefault(index, TextOffsets()))

    def rest(self, choice: wire.Choice) -> list[wire.TokenLogprob] | None:
        """The entries of ``choice`` no chunk carried yet (None: not asked)."""
        if choice.logprobs is None:
            return None
        return choice.logprobs[self._sent.get(choice.index, 0) :]

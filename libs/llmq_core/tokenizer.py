"""The byte-level tokenizer of the built-in models (llmq-tiny, llmq-sim), with ByT5's ids.

Ids: 0 pad, 1 eos, 2 unk, then byte ``b`` is id ``b + 3`` (vocabulary of 259). It matches
``transformers.ByT5Tokenizer(extra_ids=0)`` exactly, so the simulated engine and the API count tokens like llmq-tiny
without importing transformers.
"""

from __future__ import annotations

import codecs

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BYTE_OFFSET = 3
VOCAB_SIZE = 256 + BYTE_OFFSET


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (UTF-8 bytes shifted by 3), without special tokens."""
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def count_tokens(text: str) -> int:
    """Number of tokens of ``text``: its UTF-8 length in bytes."""
    return len(text.encode("utf-8"))


class IncrementalDetokenizer:
    """Turns token ids into text as they arrive, never emitting part of a UTF-8 character.

    Special ids are skipped; bytes that can never form a character are dropped; bytes of a character still incomplete
    when generation stops are dropped by :meth:`finish` (never sent as U+FFFD).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def push(self, token_ids: list[int]) -> str:
        """Text completed by ``token_ids`` (may be empty while a character is incomplete)."""
        data = bytes(t - BYTE_OFFSET for t in token_ids if BYTE_OFFSET <= t < VOCAB_SIZE)
        return self._decoder.decode(data)

    def finish(self) -> str:
        """Text still held back at the end of generation (incomplete trailing bytes are dropped)."""
        return self._decoder.decode(b"", final=True)

    def state(self) -> tuple[bytes, int]:
        """A checkpoint for :meth:`restore` (the bytes of a pending character)."""
        return self._decoder.getstate()

    def restore(self, state: tuple[bytes, int]) -> None:
        self._decoder.setstate(state)


def render_chat(messages: list[tuple[str, str]] | list) -> str:
    """The prompt text of a chat for the built-in models: one ``<|role|>`` header line per message, then the assistant's.

    ``messages`` holds ``(role, content)`` pairs or objects with ``role`` and ``content`` (e.g. ``wire.ChatMessage``).
    """
    parts = []
    for message in messages:
        role, content = message if isinstance(message, tuple) else (message.role, message.content)
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)

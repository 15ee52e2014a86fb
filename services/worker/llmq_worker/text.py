"""Engine-independent text handling of one choice: incremental detokenization and stop strings.

Invariants: no part of a stop string is ever emitted, no partial UTF-8 character is ever emitted (never U+FFFD), and the
pieces returned by :meth:`ChoiceText.push` and :meth:`ChoiceText.finish` concatenate to :attr:`ChoiceText.text`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from llmq_core.tokenizer import IncrementalDetokenizer

REPLACEMENT_CHAR = "\ufffd"


class Detokenizer(Protocol):
    def push(self, token_ids: list[int]) -> str:
        """Text completed by ``token_ids`` (never part of a character)."""
        ...

    def finish(self) -> str:
        """Text still held back at the end; an incomplete trailing character is dropped."""
        ...


class WindowDetokenizer:
    """Incremental detokenizer for any tokenizer's ``decode``: re-decodes a short window of recent ids and emits the new
    suffix once it no longer ends in an incomplete character (U+FFFD). Replacement characters are never emitted."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are emitted and their text is final
        self._read = 0  # ids up to here are emitted

    def push(self, token_ids: list[int]) -> str:
        self._ids += token_ids
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :].replace(REPLACEMENT_CHAR, "")

    def finish(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :].replace(REPLACEMENT_CHAR, "")


class StopMatcher:
    """Cuts a text stream at the first complete stop string, holding back any tail that may start one."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Text safe to emit now: everything before a matched stop string, minus a tail that may still become one."""
        if self.stopped:
            return ""
        buffer = self._held + text
        # The stop completed first (earliest end; the longest on a tie) wins, as if text arrived one character at a time.
        found = [(i + len(stop), -len(stop), i) for stop in self._stops if (i := buffer.find(stop)) >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return buffer[: min(found)[2]]
        keep = max((_overlap(buffer, stop) for stop in self._stops), default=0)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back tail, at the end of generation (it did not become a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _overlap(text: str, stop: str) -> int:
    """Length of the longest proper prefix of ``stop`` that ``text`` ends with."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


class ChoiceText:
    """One choice's output: token ids in, visible text out; counts the tokens generated until a stop matched.

    ``detokenizer``: the byte-level one of the built-in models unless given (e.g. a :class:`WindowDetokenizer`).
    """

    def __init__(self, stops: list[str], detokenizer: Detokenizer | None = None) -> None:
        self._detokenizer = detokenizer or IncrementalDetokenizer()
        self._matcher = StopMatcher(stops)
        self._parts: list[str] = []
        self.tokens = 0

    @property
    def stopped(self) -> bool:
        """True once a stop string matched: later tokens are ignored and not counted."""
        return self._matcher.stopped

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)

    def push(self, token_ids: list[int]) -> str:
        """Feed generated ids; returns the newly visible text ('' while a character or a possible stop is pending)."""
        out = []
        for token_id in token_ids:
            if self.stopped:
                break
            self.tokens += 1
            out.append(self._matcher.push(self._detokenizer.push([token_id])))
        return self._emit("".join(out))

    def finish(self) -> str:
        """End of generation: the remaining visible text (an incomplete trailing character is dropped)."""
        if self.stopped:
            return ""
        return self._emit(self._matcher.push(self._detokenizer.finish()) + self._matcher.flush())

    def _emit(self, text: str) -> str:
        if text:
            self._parts.append(text)
        return text

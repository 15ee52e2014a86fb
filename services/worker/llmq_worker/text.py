"""Engine-independent text handling of one choice: incremental detokenization and stop strings.

Invariants: no part of a stop string is ever emitted, no partial UTF-8 character is ever emitted (never U+FFFD), and the
pieces returned by :meth:`ChoiceText.push` and :meth:`ChoiceText.finish` concatenate to :attr:`ChoiceText.text`.
"""

from __future__ import annotations

from llmq_core.tokenizer import IncrementalDetokenizer


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
    """One choice's output: token ids in, visible text out; counts the tokens generated until a stop matched."""

    def __init__(self, stops: list[str]) -> None:
        self._detokenizer = IncrementalDetokenizer()
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

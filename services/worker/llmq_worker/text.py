"""Engine-independent text handling of one choice: incremental detokenization, stop strings, logprobs and the result
byte caps.

Invariants: no part of a stop string is ever emitted, no partial UTF-8 character is ever emitted (never U+FFFD), the
pieces returned by :meth:`ChoiceText.push` and :meth:`ChoiceText.finish` concatenate to :attr:`ChoiceText.text`, and
the text of all choices sharing one :class:`ResultBudget` is at most its bytes (MAX_RESULT_BYTES) in UTF-8.

Logprobs (when asked): a token's entry belongs to the choice when its text starts before the end of the kept text (it
keeps at least one of its bytes, or it comes before one that does): so a stop sequence or a cap that cuts the text
drops the tokens from the cut on, a token holding the start of the stop sequence included, and an end token (no text)
is left out. An entry is released with the piece of text that reaches into its token, so the entries released with
the pieces concatenate to :attr:`ChoiceText.logprobs`: a stream carries exactly the entries of the final result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

from llmq_core.constants import MAX_LOGPROBS_BYTES, MAX_RESULT_BYTES
from llmq_core.tokenizer import IncrementalDetokenizer
from llmq_core.wire import FinishReason, TokenLogprob

REPLACEMENT_CHAR = "\ufffd"
_json = msgspec.json.Encoder()


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
        self.matched: str | None = None  # the stop string that ended the stream

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        """Text safe to emit now: everything before a matched stop string, minus a tail that may still become one."""
        if self.stopped:
            return ""
        buffer = self._held + text
        # The stop completed first (earliest end; the longest on a tie) wins, as if text arrived one character at a time.
        found = [(i + len(stop), -len(stop), i) for stop in self._stops if (i := buffer.find(stop)) >= 0]
        if found:
            end, longest, start = min(found)
            self.matched = buffer[start:end]
            self._held = ""
            return buffer[:start]
        keep = max((_overlap(buffer, stop) for stop in self._stops), default=0)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back tail, at the end of generation (it did not become a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def state(self) -> tuple[str, str | None]:
        """A checkpoint: :meth:`restore` undoes every push since."""
        return self._held, self.matched

    def restore(self, state: tuple[str, str | None]) -> None:
        self._held, self.matched = state


def _overlap(text: str, stop: str) -> int:
    """Length of the longest proper prefix of ``stop`` that ``text`` ends with."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


class ResultBudget:
    """The UTF-8 bytes the choices of one result may still add: every engine stops a request's generation where its
    text reaches ``limit_bytes`` (default MAX_RESULT_BYTES), or its logprob entries (JSON-encoded) reach
    ``logprob_limit_bytes`` (default MAX_LOGPROBS_BYTES), so every result fits one Kafka record."""

    def __init__(self, limit_bytes: int = MAX_RESULT_BYTES, logprob_limit_bytes: int = MAX_LOGPROBS_BYTES) -> None:
        self.left_bytes = limit_bytes
        self.logprob_left_bytes = logprob_limit_bytes

    def take_logprob(self, entry: TokenLogprob) -> bool:
        """Spend the JSON size of ``entry``; False (nothing spent, and nothing will be again) when it does not fit."""
        size = len(_json.encode(entry))
        if size > self.logprob_left_bytes:
            self.logprob_left_bytes = 0
            return False
        self.logprob_left_bytes -= size
        return True

    @property
    def exhausted(self) -> bool:
        """Nothing more may be added (the cap is reached, or text was already cut at it)."""
        return self.left_bytes <= 0

    def take(self, text: str) -> str:
        """The longest prefix of ``text`` that fits, cut at a character boundary; its bytes are spent. Once a cut
        happens the budget is exhausted, so no later (shorter) piece can follow text that was dropped."""
        size = len(text.encode())
        if size <= self.left_bytes:
            self.left_bytes -= size
            return text
        kept = text.encode()[: max(0, self.left_bytes)].decode(errors="ignore")
        self.left_bytes = 0
        return kept


class ChoiceText:
    """One choice's output: token ids in, visible text out; counts the tokens generated until a stop matched or the
    ``budget`` (shared by the choices of one request; its own one of MAX_RESULT_BYTES unless given) ran out.

    ``detokenizer``: the byte-level one of the built-in models unless given (e.g. a :class:`WindowDetokenizer`).
    ``logprobs``: the request asks for them (see the module's rule): :meth:`push` then takes one entry per id.
    """

    def __init__(
        self,
        stops: list[str],
        detokenizer: Detokenizer | None = None,
        budget: ResultBudget | None = None,
        *,
        logprobs: bool = False,
    ) -> None:
        self._detokenizer = detokenizer or IncrementalDetokenizer()
        self._matcher = StopMatcher(stops)
        self._budget = budget or ResultBudget()
        self._parts: list[str] = []
        self.tokens = 0
        self.capped = False  # the result's byte cap ended this choice: later tokens are ignored and not counted
        self._entries: list[TokenLogprob] | None = [] if logprobs else None  # of the tokens counted
        self._starts: list[int] = []  # each entry's token: where its text starts in the detokenized bytes
        self._raw_bytes = 0  # bytes the detokenizer gave so far (the emitted text is a prefix of them)
        self._emitted_bytes = 0
        self._released = 0  # entries released with the text so far
        self._taken = 0  # of them, handed out by take_logprobs

    @property
    def stopped(self) -> bool:
        """True once a stop string matched: later tokens are ignored and not counted."""
        return self._matcher.stopped

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended this choice, if one did."""
        return self._matcher.matched

    @property
    def done(self) -> bool:
        """A stop string or the byte cap ended this choice: its engine may stop generating it."""
        return self.stopped or self.capped

    def finish_reason(self, natural_end: bool) -> FinishReason:
        """``stop`` for a matched stop string or a ``natural_end`` (EOS, nothing to generate); ``length`` for max_tokens
        or the byte cap."""
        if self.stopped:
            return "stop"
        return "stop" if natural_end and not self.capped else "length"

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """The entries released with the text so far (None when not asked)."""
        return None if self._entries is None else self._entries[: self._released]

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The entries released since the last call (None when not asked): those of the text pushed since."""
        if self._entries is None:
            return None
        taken, self._taken = self._entries[self._taken : self._released], self._released
        return taken

    def push(self, token_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> str:
        """Feed generated ids; returns the newly visible text ('' while a character or a possible stop is pending).

        With the byte-level detokenizer cost is in bytes, not tokens: the ids go through as one slice unless that slice
        ends the choice (a stop string or the byte cap); only then is it rolled back and replayed id by id, to count
        exactly the tokens before the end. (A window detokenizer may hold text across a slice's bounds, so a slice could
        end later than ids one by one: it always goes id by id; its engines push one id per step anyway.)
        """
        if self.done:
            return ""
        if self._entries is not None:
            if logprobs is None or len(logprobs) != len(token_ids):
                raise ValueError(f"{len(token_ids)} ids need as many logprob entries, got {logprobs!r:.80}")
            return self._push_each(token_ids, logprobs)
        if not isinstance(self._detokenizer, IncrementalDetokenizer):
            return self._push_each(token_ids)
        checkpoint = self._detokenizer.state(), self._matcher.state()
        text = self._matcher.push(self._detokenizer.push(token_ids))
        if not self._matcher.stopped and len(text.encode()) < self._budget.left_bytes:
            self.tokens += len(token_ids)
            return self._emit(self._budget.take(text))
        self._detokenizer.restore(checkpoint[0])
        self._matcher.restore(checkpoint[1])
        return self._push_each(token_ids)

    def prime(self, token_ids: list[int]) -> str:
        """Resume a choice from the ids an earlier attempt generated (a continuation): they are pushed as if generated
        here (counted in :attr:`tokens` once; a stop string or a character split at the seam joins the ids that follow)
        and the text they release is returned. Without logprobs only (a continuation never asks them)."""
        return self.push(list(token_ids))

    def counted(self, token_ids: list[int], before: int) -> tuple[int, ...]:
        """Of ``token_ids`` just pushed when :attr:`tokens` was ``before``, those counted (the ids an end left out are
        ignored): what a ChunkEvent reports."""
        return tuple(token_ids[: self.tokens - before])

    def _push_each(self, token_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> str:
        out = []
        for i, token_id in enumerate(token_ids):
            self.capped = self.capped or self._budget.exhausted
            if logprobs is not None and not self.done and not self._budget.take_logprob(logprobs[i]):
                self.capped = True
            if self.done:
                break
            self.tokens += 1
            raw = self._detokenizer.push([token_id])
            if logprobs is not None:
                self._entries.append(logprobs[i])
                self._starts.append(self._raw_bytes)
                self._raw_bytes += len(raw.encode())
            out.append(self._budget.take(self._matcher.push(raw)))
            self.capped = self._budget.exhausted
        return self._emit("".join(out))

    def finish(self) -> str:
        """End of generation: the remaining visible text (an incomplete trailing character is dropped)."""
        if self.done:
            return ""
        rest = self._matcher.push(self._detokenizer.finish()) + self._matcher.flush()
        kept = self._budget.take(rest)
        self.capped = len(kept) < len(rest)
        return self._emit(kept)

    def _emit(self, text: str) -> str:
        if text:
            self._parts.append(text)
            self._emitted_bytes += len(text.encode())
            while self._released < len(self._starts) and self._starts[self._released] < self._emitted_bytes:
                self._released += 1
        return text

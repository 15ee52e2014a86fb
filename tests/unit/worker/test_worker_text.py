"""Stop strings, incremental detokenization and logprob entries of one choice (engine-independent)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from llmq_core.tokenizer import EOS_ID, VOCAB_SIZE, IncrementalDetokenizer, encode
from llmq_core.wire import TokenLogprob
from llmq_worker import logprobs
from llmq_worker.text import ChoiceText, ResultBudget, StopMatcher, WindowDetokenizer


def reference_cut(text: str, stops: list[str]) -> str:
    """The text before the first stop string to complete (the longest one when several complete at once)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            return text[: end - max(map(len, ending))]
    return text


def chunked(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def test_stop_string_split_over_chunks_is_held_back_then_cut():
    matcher = StopMatcher(["</end>"])
    assert matcher.push("answer </") == "answer "
    assert matcher.push("en") == ""
    assert matcher.push("d> more") == ""
    assert matcher.stopped and matcher.flush() == ""


def test_held_tail_that_never_becomes_a_stop_is_released():
    matcher = StopMatcher(["xyz"])
    assert matcher.push("abxy") == "ab"
    assert matcher.push("q") == "xyq"
    assert matcher.push("x") == ""
    assert matcher.flush() == "x"


def test_the_stop_completed_first_wins():
    matcher = StopMatcher(["abcd", "bc"])
    assert matcher.push("abcd") == "a"
    assert matcher.matched == "bc"


def test_the_matched_stop_is_named_and_a_restore_forgets_it():
    matcher = StopMatcher(["xyz", "q"])
    checkpoint = matcher.state()
    assert matcher.push("abxyz") == "ab" and matcher.matched == "xyz"
    matcher.restore(checkpoint)
    assert matcher.matched is None and not matcher.stopped


alphabet = st.sampled_from("abc é😀")
texts, stop_lists = st.text(alphabet, max_size=30), st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3)


@given(texts, stop_lists, st.lists(st.integers(0, 40)))
def test_streamed_output_is_the_reference_cut_for_any_chunking(text, stops, cuts):
    matcher = StopMatcher(stops)
    out = "".join(matcher.push(chunk) for chunk in chunked(text, cuts)) + matcher.flush()
    assert out == reference_cut(text, stops)


@given(texts, stop_lists, st.lists(st.integers(0, 120)))
def test_choice_text_never_splits_characters_and_pieces_concatenate(text, stops, cuts):
    ids = encode(text)
    choice = ChoiceText(stops)
    pieces = [choice.push(part) for part in _split(ids, cuts)] + [choice.finish()]
    assert "".join(pieces) == choice.text == reference_cut(text, stops)
    assert all("\ufffd" not in p for p in pieces)
    if not choice.stopped:
        assert choice.tokens == len(ids)


def test_invalid_utf8_and_special_ids_are_dropped_but_counted():
    choice = ChoiceText([])
    pieces = [
        choice.push([0xFF + 3, ord("a") + 3, 1, 0]),
        choice.push([0xE4 + 3, 0xB8 + 3]),
    ]  # bad byte, a, eos, pad, half 中
    assert pieces + [choice.finish()] == ["a", "", ""]
    assert choice.text == "a" and choice.tokens == 6


def test_tokens_after_a_stop_are_not_counted():
    choice = ChoiceText(["c"])
    assert choice.push(encode("abcdef")) == "ab"
    assert choice.stopped and choice.tokens == 3


def _split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def test_window_detokenizer_holds_partial_characters_and_drops_invalid_bytes():
    detokenizer = WindowDetokenizer(lambda ids: bytes(ids).decode("utf-8", errors="replace"))  # a byte-fallback decode
    data = "aé😀".encode() + b"\xff" + b"b" + "中".encode()[:2]  # an invalid byte, then a cut-off character
    pieces = [detokenizer.push([byte]) for byte in data] + [detokenizer.finish()]
    assert "".join(pieces) == "aé😀b"
    assert all("\ufffd" not in piece for piece in pieces)
    assert pieces[1:3] == ["", "é"]  # the first byte of é is held back until the second arrives


class _CountingDetokenizer(IncrementalDetokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def push(self, token_ids: list[int]) -> str:
        self.calls += 1
        return super().push(token_ids)


def test_a_slice_that_ends_nothing_costs_one_push_not_one_per_token():
    """A large request's cost must be in bytes (slices), not Python work per token (QA finding 3)."""
    detokenizer = _CountingDetokenizer()
    choice = ChoiceText(["never"], detokenizer, ResultBudget(1 << 20))
    assert choice.push(encode("abc" * 10_000)) == "abc" * 10_000
    assert detokenizer.calls == 1 and choice.tokens == 30_000


def _one_by_one(choice: ChoiceText, ids: list[int]) -> list[str]:
    return [choice.push([token_id]) for token_id in ids]


@given(
    st.one_of(st.text(alphabet, max_size=30).map(encode), st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=40)),
    st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3),
    st.lists(st.integers(0, 120)),
    st.integers(0, 60),
)
def test_slices_end_exactly_where_token_by_token_pushes_end(ids, stops, cuts, limit_bytes):
    """Same text, token count, finish reason and cap for any slicing of any ids (invalid bytes, special ids included),
    under any byte budget."""
    sliced, single = (
        ChoiceText(stops, budget=ResultBudget(limit_bytes)),
        ChoiceText(stops, budget=ResultBudget(limit_bytes)),
    )
    pieces = [sliced.push(part) for part in _split(ids, cuts)] + [sliced.finish()]
    reference = _one_by_one(single, ids) + [single.finish()]
    assert "".join(pieces) == sliced.text == "".join(reference) == single.text
    assert (sliced.tokens, sliced.stopped, sliced.capped) == (single.tokens, single.stopped, single.capped)
    assert len(sliced.text.encode()) <= limit_bytes


# --- logprob entries: which tokens a choice keeps, and when a stream gets them -----------------------------------------


def entries_of(ids: list[int]) -> list[TokenLogprob]:
    """One entry per id, told apart by its logprob (-position)."""
    return [logprobs.entry(logprobs.byte_token_bytes, t, (-float(k), [])) for k, t in enumerate(ids)]


def push_with_logprobs(text: ChoiceText, ids: list[int], cuts: list[int]) -> list[TokenLogprob]:
    """Push ``ids`` in slices at ``cuts``, then finish; returns the entries released along the way, in order."""
    released, bounds = [], sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    entries = entries_of(ids)
    for a, b in zip(bounds, bounds[1:]):
        text.push(ids[a:b], entries[a:b])
        released += text.take_logprobs()
    text.finish()
    return released + text.take_logprobs()


def test_a_stop_sequence_drops_the_tokens_from_the_one_it_starts_in():
    ids = encode("ab. cd")
    text = ChoiceText([". "], logprobs=True)
    assert push_with_logprobs(text, ids, [2]) == entries_of(ids)[:2]
    assert text.text == "ab" and [e.token for e in text.logprobs] == ["a", "b"]


def test_a_token_holding_part_of_a_character_is_kept_with_its_own_bytes():
    ids = encode("é!")
    text = ChoiceText([], logprobs=True)
    released = push_with_logprobs(text, ids, [1])
    assert [(e.token, e.bytes) for e in released] == [("\\xc3", [0xC3]), ("\\xa9", [0xA9]), ("!", [0x21])]
    assert released == text.logprobs


def test_an_end_token_after_the_text_is_left_out():
    ids = [*encode("ok"), EOS_ID]
    text = ChoiceText([], logprobs=True)
    assert [e.token for e in push_with_logprobs(text, ids, [])] == ["o", "k"]
    assert text.tokens == 3  # counted in usage all the same


@given(
    text=st.text(alphabet="ab.€ ", max_size=24),
    stops=st.lists(st.text(alphabet="ab.€ ", min_size=1, max_size=3), max_size=2),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=6),
)
def test_streamed_entries_are_the_final_entries_for_any_slicing(text, stops, cuts):
    ids = encode(text)
    choice = ChoiceText(stops, logprobs=True)
    released = push_with_logprobs(choice, ids, cuts)
    assert released == choice.logprobs
    kept = len(choice.text.encode())
    # exactly the tokens that start inside the kept text (one byte each here)
    assert [e.logprob for e in released] == [-float(k) for k in range(min(kept, len(ids)))]


def test_the_logprob_budget_ends_every_choice_of_the_result_as_length():
    one = len(msgspec.json.encode(entries_of(encode("a"))[0]))
    budget = ResultBudget(logprob_limit_bytes=3 * one)
    first, second = ChoiceText([], budget=budget, logprobs=True), ChoiceText([], budget=budget, logprobs=True)
    first.push(encode("ab"), entries_of(encode("ab")))
    second.push(encode("cd"), entries_of(encode("cd")))
    assert (first.text, second.text) == ("ab", "c") and (first.tokens, second.tokens) == (2, 1)
    assert second.capped and second.finish_reason(natural_end=True) == "length"
    assert second.push(encode("e"), entries_of(encode("e"))) == "" and len(second.logprobs) == 1


# --- priming (a continuation: a choice resumed from the ids an earlier attempt generated) ------------------------------


def test_priming_that_ends_inside_a_stop_string_holds_it_back_and_the_stop_matches_across_the_seam():
    choice = ChoiceText(["END"])
    assert choice.prime(encode("abcEN")) == "abc"  # "EN" may start the stop: held back
    assert choice.tokens == 5 and not choice.done
    rest = encode("Dxyz")
    assert choice.push(rest) == ""
    assert (choice.stopped, choice.stop_sequence, choice.text) == (True, "END", "abc")
    assert choice.tokens == 6  # the D that completed the stop counts, the ids after it do not
    assert choice.counted(rest, 5) == (rest[0],)


def test_priming_that_ends_inside_a_character_joins_it_with_the_ids_that_follow():
    ids = encode("aé😀!")  # 1 + 2 + 4 + 1 bytes
    choice = ChoiceText([])
    assert choice.prime(ids[:5]) == "aé"  # two of 😀's four bytes: held back, never U+FFFD
    assert choice.push(ids[5:]) == "😀!"
    assert (choice.finish(), choice.text, choice.tokens) == ("", "aé😀!", len(ids))


def test_priming_a_window_detokenizer_joins_a_character_across_the_seam():
    data = "é😀x".encode()
    choice = ChoiceText([], WindowDetokenizer(lambda ids: bytes(ids).decode("utf-8", errors="replace")))
    assert choice.prime(list(data[:3])) == "é"
    assert choice.push(list(data[3:])) == "😀x"
    assert (choice.text, choice.tokens) == ("é😀x", len(data))


def test_priming_past_a_stop_ends_the_choice_at_once():
    choice = ChoiceText(["\n"])
    assert choice.prime(encode("ok\nmore")) == "ok"
    assert choice.done and choice.finish_reason(False) == "stop" and choice.tokens == 3

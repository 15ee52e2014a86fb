"""Stop strings and incremental detokenization of one choice (engine-independent)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmq_core.tokenizer import VOCAB_SIZE, IncrementalDetokenizer, encode
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

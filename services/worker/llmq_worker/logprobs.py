"""Logprob entries (``wire.TokenLogprob``) from token ids and log probabilities, for every engine.

A token's ``bytes`` are what it adds to the text (a byte-level BPE token may hold part of a UTF-8 character); its
``token`` is those bytes as UTF-8, a byte that is no whole character spelled ``\\xNN`` (OpenAI's convention). A special
token (an end of turn) adds no text: its ``token`` is its name and its ``bytes`` those of the name.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from llmq_core import tokenizer as byte_tokenizer
from llmq_core.wire import TokenLogprob, TopLogprob

# (chosen token's log probability, [(alternative id, its log probability), ...] most likely first)
RawLogprobs = tuple[float, Sequence[tuple[int, float]]]
BYTE_SPECIALS = {byte_tokenizer.PAD_ID: b"<pad>", byte_tokenizer.EOS_ID: b"</s>", byte_tokenizer.UNK_ID: b"<unk>"}


def token_text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def entry(token_bytes: Callable[[int], bytes], token_id: int, raw: RawLogprobs) -> TokenLogprob:
    """The entry of generated ``token_id`` (``token_bytes``: a vocabulary's id -> bytes)."""
    logprob, top = raw
    data = token_bytes(token_id)
    return TokenLogprob(
        token=token_text(data),
        logprob=logprob,
        bytes=list(data),
        top_logprobs=[_top(token_bytes(i), lp) for i, lp in top],
    )


def _top(data: bytes, logprob: float) -> TopLogprob:
    return TopLogprob(token=token_text(data), logprob=logprob, bytes=list(data))


def byte_token_bytes(token_id: int) -> bytes:
    """The bytes of an id of the built-in byte vocabulary (llmq-tiny, llmq-sim)."""
    if byte_tokenizer.BYTE_OFFSET <= token_id < byte_tokenizer.VOCAB_SIZE:
        return bytes([token_id - byte_tokenizer.BYTE_OFFSET])
    return BYTE_SPECIALS.get(token_id, b"")


class Vocabulary:
    """id -> bytes of a transformers tokenizer (memoised): byte-level BPE tokens map back through GPT-2's byte alphabet,
    SentencePiece tokens turn ``▁`` into a space and ``<0xNN>`` into byte NN, special tokens are their names. Built on
    first use (an engine whose requests never ask pays nothing)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}

    @functools.cached_property
    def special(self) -> frozenset[int]:
        return frozenset(self._tokenizer.all_special_ids)

    @functools.cached_property
    def _alphabet(self) -> dict[str, int] | None:
        decoder = getattr(getattr(self._tokenizer, "backend_tokenizer", None), "decoder", None)
        return byte_alphabet() if type(decoder).__name__ == "ByteLevel" else None

    def __call__(self, token_id: int) -> bytes:
        data = self._cache.get(token_id)
        if data is None:
            data = self._cache[token_id] = self._bytes(token_id)
        return data

    def _bytes(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if token_id in self.special:
            return piece.encode()
        alphabet = self._alphabet
        if alphabet is not None:
            if all(char in alphabet for char in piece):
                return bytes(alphabet[char] for char in piece)
            return piece.encode()  # an added token outside the byte alphabet: its text as it is
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()


def byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, char -> byte: printable Latin-1 bytes stand for themselves, the others for
    U+0100 upwards in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(shifted)}


def simulated(token_ids: Sequence[int], first_position: int, top: int) -> list[RawLogprobs]:
    """llmq-sim's logprobs of the replayed ``token_ids`` (the first at ``first_position`` of its choice): deterministic
    and plausible. The replayed token is the most likely (as at temperature 0) with probability 0.5 to 0.9, the ``top``
    alternatives share the rest halving (the replayed one first, then other lowercase letters)."""
    out = []
    for offset, token_id in enumerate(token_ids):
        position = first_position + offset
        chosen = 0.5 + 0.4 * ((token_id * 31 + position * 17) % 101) / 100
        letters = [byte_tokenizer.BYTE_OFFSET + ord("a") + (token_id + k) % 26 for k in range(26)]
        alternatives = list(dict.fromkeys([token_id, *letters]))[:top]
        probabilities = [chosen] + [(1 - chosen) / 2**k for k in range(1, len(alternatives))]
        out.append((math.log(chosen), [(i, math.log(p)) for i, p in zip(alternatives, probabilities, strict=True)]))
    return out

"""Compiled grammars of structured outputs (``wire.Structured``) for one tokenizer, cached per schema.

Compiling a schema (llguidance's ``LLMatcher``: grammar, lexer and the token trie walk) costs from well under a
millisecond to tens of milliseconds; the cache keeps the compiled matcher of each (kind, schema) and every sequence
takes a copy (``deep_copy``: microseconds). A miss compiles in a thread (:meth:`GrammarCache.compile`, called through
``run_in_executor`` by the engines), so neither the event loop nor the running sequences wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from typing import Any

import llguidance
import numpy as np

from llmq_core import structured
from llmq_core import tokenizer as byte_tokenizer
from llmq_core.constants import STRUCTURED_KINDS
from llmq_core.metrics import GrammarStats
from llmq_core.wire import Structured
from llmq_worker.engine import InvalidRequest

DEFAULT_ENTRIES = 256  # compiled grammars kept per worker (an LRU); each holds its grammar's lexer (kilobytes to MBs)


class GrammarError(ValueError):
    """The schema does not compile against this tokenizer (the API's check is tokenizer-free)."""


def ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_id: int, byte_level: bool) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer: a fast HF tokenizer as it is, or llmq's byte vocabulary (ids
    ``BYTE_OFFSET + b``); ``vocab_size``: the logits' width (ids past the tokenizer's are never allowed)."""
    if not byte_level:
        from llguidance import hf  # imports transformers: not in the images without torch (llmq-sim's needs none)

        return hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_token_id)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary(eos_token_id)), n_vocab=vocab_size)


class _ByteVocabulary:
    """llmq_core.tokenizer's byte vocabulary in the shape llguidance's TokenizerWrapper reads."""

    def __init__(self, eos_token_id: int) -> None:
        offset = byte_tokenizer.BYTE_OFFSET
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self.tokens = [f"<special_{i}>".encode() for i in range(offset)] + [bytes([b]) for b in range(256)]
        self.special_token_ids = list(range(offset))

    def __call__(self, text: bytes) -> list[int]:
        return [b + byte_tokenizer.BYTE_OFFSET for b in text]


class GrammarCache:
    """Compiled matchers per (kind, schema) of one tokenizer, least recently used dropped past ``entries``."""

    def __init__(
        self, tokenizer: llguidance.LLTokenizer, stats: GrammarStats | None = None, entries: int = DEFAULT_ENTRIES
    ) -> None:
        self.tokenizer = tokenizer
        self.stats = stats or GrammarStats()
        self._entries = entries
        self._compiled: collections.OrderedDict[tuple[str, str], llguidance.LLMatcher] = collections.OrderedDict()
        self._lock = threading.Lock()  # compiles run in threads
        self._compiling: dict[tuple[str, str], asyncio.Future] = {}  # on the event loop: one compile per schema

    def cached(self, constraint: Structured) -> llguidance.LLMatcher | None:
        """A fresh matcher of ``constraint`` when it is compiled already (a hit), else None."""
        with self._lock:
            matcher = self._compiled.get(_key(constraint))
            if matcher is None:
                return None
            self._compiled.move_to_end(_key(constraint))
        self.stats.hits += 1
        return matcher.deep_copy()

    def compiling(self, constraint: Structured) -> asyncio.Future:
        """The compile of ``constraint`` in a thread (call on the event loop): one in flight per schema, which later
        requests of the same schema wait on too (counted as hits). Its result is the compiled matcher: copy it."""
        key = _key(constraint)
        future = self._compiling.get(key)
        if future is not None:
            self.stats.hits += 1
            return future
        future = asyncio.get_running_loop().run_in_executor(None, self.compile, constraint)
        self._compiling[key] = future
        future.add_done_callback(lambda _: self._compiling.pop(key, None))
        return future

    def compile(self, constraint: Structured) -> llguidance.LLMatcher:
        """Compile ``constraint`` (blocking: run it off the event loop), keep it, and return a fresh matcher of it.
        Raises GrammarError when it does not compile."""
        started = time.perf_counter()
        try:
            matcher = llguidance.LLMatcher(self.tokenizer, structured.grammar(constraint), log_level=0)
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        self.stats.compiled(time.perf_counter() - started)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self._compiled[_key(constraint)] = matcher
            while len(self._compiled) > self._entries:
                self._compiled.popitem(last=False)
        return matcher.deep_copy()


def check_constraint(constraint: Structured) -> None:
    """Raise InvalidRequest for a kind this worker does not know (a Kafka-direct producer's newer one)."""
    if constraint.kind not in STRUCTURED_KINDS:
        raise InvalidRequest(f"unknown structured output kind {constraint.kind[:40]!r}", "response_format")


def _key(constraint: Structured) -> tuple[str, str]:
    return constraint.kind, constraint.schema


class SequenceGrammar:
    """The matcher of one sequence, advanced by the tokens it generated; shared, never copied (the batching library
    deep-copies a request's processor arguments when it re-queues the request)."""

    __slots__ = ("consumed", "failed", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.consumed = 0
        self.failed = False

    def __deepcopy__(self, memo) -> SequenceGrammar:
        return self

    def fill_mask(self, generated: list[int], row: np.ndarray) -> bool:
        """Consume ``generated[consumed:]``, then write the allowed next tokens into ``row`` (int32 words, one bit per
        token). False, leaving ``row`` alone, when the matcher has failed (a token it refused: never with its own masks)."""
        if not self.failed and len(generated) > self.consumed:
            self.failed = not self.matcher.consume_tokens(generated[self.consumed :])
            self.consumed = len(generated)
        if self.failed or self.matcher.is_error():
            self.failed = True
            return False
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return True


def minimal_instance(schema: Any) -> Any:
    """A small instance of a JSON Schema, for llmq-sim's answers: the first of an ``enum``, ``const``, ``anyOf`` or
    ``oneOf``; every property of an object (an empty one when it names none); ``minItems`` (at least one) copies of an
    array's item; the least number or string a bound allows. Not honoured: ``pattern``, ``format``, ``$ref``,
    ``allOf`` and ``uniqueItems`` beyond one item (the simulated engine constrains nothing; a real one's grammar does)."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return minimal_instance(schema[key][0])
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        return {name: minimal_instance(sub) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        count = max(1, schema.get("minItems", 1)) if schema.get("maxItems", 1) > 0 else 0
        return [minimal_instance(schema.get("items", {}))] * count
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return int(low) if kind == "integer" else low
    if kind == "string":
        return "x" * schema.get("minLength", 1)
    return {"boolean": True, "null": None}.get(kind, {})


def minimal_answer(constraint: Structured) -> str:
    """llmq-sim's answer to ``constraint``: :func:`minimal_instance` of its schema (``{}`` for any object), compact."""
    schema = json.loads(constraint.schema) if constraint.schema else structured.ANY_OBJECT
    return structured.compact(minimal_instance(schema) if constraint.kind != "json_object" else {})

"""Prefix caching on transformers' ContinuousBatchingManager: how many prompt tokens each request found cached, tenant
scope for its block sharing, and a budget for the blocks it keeps.

The library shares complete KV blocks between requests whose prompts start with the same tokens (``allow_block_sharing``,
on by default: blocks of ``page_size`` tokens, chained by hash, kept after their request ends until memory runs short).
It reports no hit, its block hash has no salt, so every tenant's prompts would share blocks, and it keeps every cached
block until memory runs short. Three hooks, installed once per process on the library's classes (the cache is built in
the manager's own thread; one engine per worker process, so the budget is the process's):
- ``PagedAttentionCache.search_prefix_match`` records the tokens matched per manager request id in :data:`HITS`;
- the block hash of a request's first block folds in its salt (:data:`SALTS`, by manager request id, set by the
  engine before it adds the request): requests with different salts share no block. A request without a salt hashes as
  the library does;
- ``PagedAttentionCache.free_blocks`` (a request ended) then evicts cached blocks past :data:`budget` tokens as the
  worker's ledger does (a :class:`~llmq_worker.prefix_cache.SegmentedLRU` per allocator: a block the request had
  matched counts as used again), so that a worker holds about its budget's worth of prefixes, as its ledger accounts.
Both dicts are written by one thread and read by the other through single dict operations (atomic under the GIL).
"""

from __future__ import annotations

import hashlib
import threading

from transformers.generation.continuous_batching import cache as cb_cache
from transformers.generation.continuous_batching.cache_allocators import cache_allocator

from llmq_worker.prefix_cache import SegmentedLRU

HITS: dict[str, int] = {}  # manager request id -> prompt tokens its prefix match found cached
SALTS: dict[str, int] = {}  # manager request id -> the salt of its first block (unsigned 64-bit)
_matched: dict[str, int] = {}  # manager request id -> tokens matched, for the budget (the manager's thread only)
_current = threading.local()  # the salt of the request the library is hashing blocks for, in the manager's thread
budget = {"tokens": None}  # cached tokens kept per allocator after a request ends (None: as the library keeps them)
_installed = False


def salt_of(key: str) -> int:
    """A salt for ``key`` (a tenant id), as the library's block hashes are: unsigned 64-bit."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=False)


def install(budget_tokens: int | None = None) -> None:
    """Hook the library (idempotent); ``budget_tokens``: the cached tokens kept (None: no bound of llmq's)."""
    global _installed
    budget["tokens"] = budget_tokens
    if _installed:
        return
    _installed = True
    library_hash = cache_allocator.compute_block_hash
    paged = cb_cache.PagedAttentionCache
    search, mark, free = paged.search_prefix_match, paged.mark_complete_blocks, paged.free_blocks

    def salted_hash(parent_hash, tokens):
        if parent_hash is None:
            parent_hash = getattr(_current, "salt", None)
        return library_hash(parent_hash, tokens)

    def search_prefix_match(self, request_id, prompt_ids):
        _current.salt = SALTS.get(request_id)
        try:
            matched = search(self, request_id, prompt_ids)
        finally:
            _current.salt = None
        HITS[request_id] = _matched[request_id] = matched
        return matched

    def mark_complete_blocks(self, state, complete_blocks):
        _current.salt = SALTS.get(state.request_id)
        try:
            return mark(self, state, complete_blocks)
        finally:
            _current.salt = None

    def free_blocks(self, request_id, no_cache=False):
        tables = {name: list(a.block_table.get(request_id, ())) for name, a in self.cache_allocators.items()}
        free(self, request_id, no_cache)
        matched = _matched.pop(request_id, 0)
        if budget["tokens"] is not None:
            for name, allocator in self.cache_allocators.items():
                pages = allocator.tokens_per_page
                _trim(allocator, tables[name], matched // pages, budget["tokens"] // pages)

    cache_allocator.compute_block_hash = salted_hash
    paged.search_prefix_match, paged.mark_complete_blocks, paged.free_blocks = (
        search_prefix_match,
        mark_complete_blocks,
        free_blocks,
    )


def _trim(allocator, released: list[int], matched_blocks: int, keep_blocks: int) -> None:
    """The cached blocks of the request just ``released`` are used (the first ``matched_blocks`` of them again: it
    found them cached), its first block last, so that a prompt loses its tail before its head; then the blocks past
    ``keep_blocks`` that the allocator's SegmentedLRU gives up are evicted (hashes forgotten, blocks back to the pool),
    as the library's own eviction does. A block the LRU names that is no longer cached (evicted by the library, or in
    use again) is dropped from it first; a cached block it does not know enters it as the oldest."""
    cached = allocator.ledger.cached_blocks
    lru = getattr(allocator, "_llmq_lru", None)
    if lru is None or lru.budget != keep_blocks:
        lru = allocator._llmq_lru = SegmentedLRU(keep_blocks)
    for block_id in [b for b in lru.keys_recent_first() if b not in cached]:
        lru.discard(block_id)
    mine = set(released)
    uses = [(b, 1, False) for b in cached if b not in lru and b not in mine]
    uses += [(b, 1, i < matched_blocks) for i, b in reversed(list(enumerate(released))) if b in cached]
    evicted = lru.use(uses)
    for block_id in evicted:
        del cached[block_id]
        allocator.ledger.hash_to_block.pop(allocator.ledger.block_to_hash.pop(block_id))
    if evicted:
        allocator.pool.free_blocks(allocator.index, evicted)

"""Prefix caching on transformers' ContinuousBatchingManager: how many prompt tokens each request found cached, and
tenant scope for its block sharing.

The library shares complete KV blocks between requests whose prompts start with the same tokens (``allow_block_sharing``,
on by default: blocks of ``page_size`` tokens, chained by hash, kept after their request ends until memory runs short).
It reports no hit, and its block hash has no salt, so every tenant's prompts would share blocks. Two hooks, installed
once per process on the library's classes (the cache is built in the manager's own thread):
- ``PagedAttentionCache.search_prefix_match`` records the tokens matched per manager request id in :data:`HITS`;
- the block hash of a request's first block folds in its salt (:data:`SALTS`, by manager request id, set by the
  engine before it adds the request): requests with different salts share no block. A request without a salt hashes as
  the library does.
Both dicts are written by one thread and read by the other through single dict operations (atomic under the GIL).
"""

from __future__ import annotations

import hashlib
import threading

from transformers.generation.continuous_batching import cache as cb_cache
from transformers.generation.continuous_batching.cache_allocators import cache_allocator

HITS: dict[str, int] = {}  # manager request id -> prompt tokens its prefix match found cached
SALTS: dict[str, int] = {}  # manager request id -> the salt of its first block (unsigned 64-bit)
_current = threading.local()  # the salt of the request the library is hashing blocks for, in the manager's thread
_installed = False


def salt_of(key: str) -> int:
    """A salt for ``key`` (a tenant id), as the library's block hashes are: unsigned 64-bit."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=False)


def install() -> None:
    """Hook the library (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    library_hash = cache_allocator.compute_block_hash
    search, mark = cb_cache.PagedAttentionCache.search_prefix_match, cb_cache.PagedAttentionCache.mark_complete_blocks

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
        HITS[request_id] = matched
        return matched

    def mark_complete_blocks(self, state, complete_blocks):
        _current.salt = SALTS.get(state.request_id)
        try:
            return mark(self, state, complete_blocks)
        finally:
            _current.salt = None

    cache_allocator.compute_block_hash = salted_hash
    cb_cache.PagedAttentionCache.search_prefix_match = search_prefix_match
    cb_cache.PagedAttentionCache.mark_complete_blocks = mark_complete_blocks


def cached_blocks(manager) -> int:
    """Blocks the manager's cache keeps hashed for sharing (0 before its generation thread built the cache)."""
    processor = getattr(manager, "batch_processor", None)
    cache = getattr(processor, "cache", None)
    if cache is None:
        return 0
    return sum(len(a.ledger.block_to_hash) for a in cache.cache_allocators.values())

"""A prompt's prefix identity, shared by workers (what their prefix cache holds) and batchers (who holds a request's
prefix): the prompt's leading bytes as a chain of block hashes, as llm-d's and vLLM's prefix caches chain token blocks.

The chain is over UTF-8 bytes, not token ids, so that a batcher never tokenizes: block ``i``'s hash covers every byte
before its end (each hash folds in its parent's), and two prompts share their first ``k`` hashes exactly when they share
their first ``k * block_bytes`` bytes (and salt). Only whole blocks are hashed. The salt is the model, the tools and,
when the cache is scoped to tenants, the tenant: a cache shared across tenants is a timing side channel (vLLM's
``cache_salt``), so by default one tenant's prefix never matches another's.

Costs about 1 us per block (blake2b of PREFIX_BLOCK_BYTES); a chain stops at PREFIX_MAX_BLOCKS blocks.
"""

from __future__ import annotations

import hashlib

from llmq_core.constants import PREFIX_BLOCK_BYTES, PREFIX_MAX_BLOCKS
from llmq_core.wire import GenerationRequest

_ROLE_END = b"\x00"  # between a chat turn's role and its content
_TURN_END = b"\x1e"  # after each chat turn


def prompt_bytes(request: GenerationRequest) -> bytes:
    """The bytes a request's prompt is identified by: the completions prompt, or each chat turn's role and content in
    order (the rendered template differs by model, but two requests sharing these share the rendered prefix too)."""
    if request.messages is None:
        return (request.prompt or "").encode()
    return b"".join(m.role.encode() + _ROLE_END + m.content.encode() + _TURN_END for m in request.messages)


def salt(request: GenerationRequest, tenant_scoped: bool) -> bytes:
    """What a chain is keyed by besides the prompt: the model, the request's tools (the template renders them before
    the turns), and its tenant when ``tenant_scoped``."""
    tools = "".join(f"{t.name}\x00{t.description}\x00{t.parameters}\x1e" for t in request.tools or ())
    tenant = request.tenant_id if tenant_scoped else ""
    return f"{request.model}\x00{tenant}\x00{tools}".encode()


def chain(
    data: bytes, salt_bytes: bytes, block_bytes: int = PREFIX_BLOCK_BYTES, max_blocks: int = PREFIX_MAX_BLOCKS
) -> tuple[int, ...]:
    """Hashes (signed int64, as the wire carries them) of the whole ``block_bytes`` blocks of ``data``, at most
    ``max_blocks``; hash ``i`` depends on ``salt_bytes`` and on every byte of blocks 0..i. Raises ValueError for a
    ``block_bytes`` below 1."""
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
    parent = hashlib.blake2b(salt_bytes, digest_size=8).digest()
    hashes = []
    for start in range(0, min(len(data) // block_bytes, max_blocks) * block_bytes, block_bytes):
        parent = hashlib.blake2b(parent + data[start : start + block_bytes], digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "little", signed=True))
    return tuple(hashes)


def request_chain(request: GenerationRequest, tenant_scoped: bool = True) -> tuple[int, ...]:
    """The prefix chain of ``request`` (see :func:`chain`), with the default block size."""
    return chain(prompt_bytes(request), salt(request, tenant_scoped))


def matched_blocks(chain_hashes: tuple[int, ...], held) -> int:
    """How many leading blocks of ``chain_hashes`` are in ``held`` (a set or mapping of hashes): a chain matches only
    as a prefix, so the count stops at the first block not held."""
    count = 0
    for block in chain_hashes:
        if block not in held:
            break
        count += 1
    return count

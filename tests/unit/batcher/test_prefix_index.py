"""The prefix index: summaries replace each other and expire, dispatches count at once, tenants stay apart, bounds."""

from __future__ import annotations

import random
import tracemalloc

from llmq_batcher.prefix_index import MAX_SENT_BLOCKS, MAX_SUMMARY_BLOCKS, WORKER_MAX_BYTES, PrefixIndex
from llmq_core import wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.prefixes import request_chain
from tests.unit.batcher.helpers import MODEL, T0, hb, make_policy, req

TTL_MS = 5000
PROMPT_A = "a" * (4 * PREFIX_BLOCK_BYTES)
PROMPT_B = "b" * (4 * PREFIX_BLOCK_BYTES)


def chain_of(prompt: str, tenant: str = "acme", scoped: bool = True) -> tuple[int, ...]:
    return request_chain(req("r", prompt=prompt, tenant=tenant), scoped)


def summary(worker_id: str, blocks, *, sent_ms: int = T0, scoped: bool = True, block_bytes: int = PREFIX_BLOCK_BYTES):
    return wire.PrefixSummary(
        worker_id=worker_id,
        model=MODEL,
        block_bytes=block_bytes,
        tenant_scoped=scoped,
        blocks=list(blocks),
        sent_ms=sent_ms,
    )


def test_a_summary_matches_a_request_as_far_as_their_prefixes_agree():
    index = PrefixIndex(TTL_MS)
    assert index.summary(summary("w1", chain_of(PROMPT_A)), MODEL, T0)
    assert index.matched("w1", chain_of(PROMPT_A), T0) == 4
    assert index.matched("w1", chain_of(PROMPT_A[: 2 * PREFIX_BLOCK_BYTES] + PROMPT_B), T0) == 2
    assert index.matched("w1", chain_of(PROMPT_B), T0) == 0
    assert index.matched("w2", chain_of(PROMPT_A), T0) == 0


def test_each_summary_replaces_the_last_and_an_older_one_is_ignored():
    index = PrefixIndex(TTL_MS)
    index.summary(summary("w1", chain_of(PROMPT_A), sent_ms=T0), MODEL, T0)
    index.summary(summary("w1", chain_of(PROMPT_B), sent_ms=T0 + 1000), MODEL, T0 + 1000)
    assert index.matched("w1", chain_of(PROMPT_A), T0 + 1000) == 0  # evicted from the worker's cache since
    assert index.matched("w1", chain_of(PROMPT_B), T0 + 1000) == 4
    assert not index.summary(summary("w1", chain_of(PROMPT_A), sent_ms=T0 + 500), MODEL, T0 + 1001)
    assert index.ignored["out_of_order"] == 1
    assert index.matched("w1", chain_of(PROMPT_B), T0 + 1001) == 4


def test_a_summary_not_renewed_within_the_ttl_is_dropped():
    index = PrefixIndex(TTL_MS)
    index.summary(summary("w1", chain_of(PROMPT_A)), MODEL, T0)
    assert index.matched("w1", chain_of(PROMPT_A), T0 + TTL_MS - 1) == 4
    assert index.matched("w1", chain_of(PROMPT_A), T0 + TTL_MS) == 0
    index.expire(T0 + TTL_MS)
    assert index.blocks() == 0


def test_lost_summaries_cost_only_what_the_batchers_own_dispatches_do_not_cover():
    """No summary came (lost, or the worker sends none): what this batcher sent counts for the TTL from dispatch."""
    index = PrefixIndex(TTL_MS)
    index.dispatched("w1", MODEL, [chain_of(PROMPT_A)], T0)
    assert index.matched("w1", chain_of(PROMPT_A), T0 + TTL_MS - 1) == 4
    assert index.matched("w1", chain_of(PROMPT_A), T0 + TTL_MS) == 0
    index.expire(T0 + TTL_MS)
    assert index.blocks() == 0


def test_a_summary_of_another_block_size_or_of_no_live_worker_is_ignored_and_counted():
    index = PrefixIndex(TTL_MS)
    assert not index.summary(summary("w1", chain_of(PROMPT_A), block_bytes=64), MODEL, T0)
    assert not index.summary(summary("w1", chain_of(PROMPT_A)), None, T0)
    assert not index.summary(summary("w1", chain_of(PROMPT_A)), "llmq-tiny", T0)
    assert index.ignored == {"block_bytes": 1, "unknown_worker": 2}
    assert index.matched("w1", chain_of(PROMPT_A), T0) == 0


def test_tenants_share_no_prefix_unless_the_worker_says_its_cache_is_shared():
    index = PrefixIndex(TTL_MS)
    index.summary(summary("scoped", chain_of(PROMPT_A, "acme")), MODEL, T0)
    index.summary(summary("shared", chain_of(PROMPT_A, "acme", scoped=False), scoped=False), MODEL, T0)
    assert index.tenant_scoped("scoped") and not index.tenant_scoped("shared")
    assert index.matched("scoped", chain_of(PROMPT_A, "acme"), T0) == 4
    assert index.matched("scoped", chain_of(PROMPT_A, "globex"), T0) == 0
    assert index.matched("shared", chain_of(PROMPT_A, "globex", scoped=False), T0) == 4


def test_what_one_worker_holds_is_bounded():
    index = PrefixIndex(TTL_MS, max_summary_blocks=10, max_sent_blocks=6)
    index.summary(summary("w1", range(100)), MODEL, T0)
    index.dispatched("w1", MODEL, [tuple(range(1000, 1004)), tuple(range(2000, 2004))], T0)
    assert index.blocks() == 10 + 6
    assert index.matched("w1", tuple(range(10)), T0) == 10  # the summary's first: the most recently used
    assert index.matched("w1", (2000, 2001, 2002, 2003), T0) == 4  # the newest dispatch's, the oldest dropped
    assert index.matched("w1", (1000,), T0) == 0


def test_a_full_worker_costs_at_most_the_stated_bytes():
    """A summary of the most blocks taken (decoded as off the wire) and dispatches of the most kept."""
    index = PrefixIndex(TTL_MS)
    rng = random.Random(7)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    message = wire.decode(wire.encode(summary("w1", (rng.getrandbits(63) for _ in range(MAX_SUMMARY_BLOCKS)))))
    index.summary(message, MODEL, T0)
    chains = [tuple(rng.getrandbits(63) for _ in range(32)) for _ in range(MAX_SENT_BLOCKS // 32)]
    index.dispatched("w1", MODEL, chains, T0)
    del message, chains
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert index.blocks() == MAX_SUMMARY_BLOCKS + MAX_SENT_BLOCKS
    assert used <= WORKER_MAX_BYTES, used


def test_a_worker_the_fleet_removes_is_forgotten():
    policy, clock = make_policy(worker_heartbeat_timeout_ms=2000)
    policy.on_heartbeat(hb("w1", now_ms=clock.now_ms()), clock.now_ms())
    policy.on_prefix_summary(summary("w1", chain_of(PROMPT_A)), clock.now_ms())
    assert policy.prefixes.matched("w1", chain_of(PROMPT_A), clock.now_ms()) == 4
    clock.advance(2001)
    policy.schedule(clock.now_ms())
    assert policy.prefixes.blocks() == 0
    assert policy.prefixes.matched("w1", chain_of(PROMPT_A), clock.now_ms()) == 0


def test_a_summary_of_a_worker_not_heard_yet_is_ignored():
    policy, clock = make_policy()
    policy.on_prefix_summary(summary("w1", chain_of(PROMPT_A)), clock.now_ms())
    assert policy.prefixes.ignored["unknown_worker"] == 1
    assert policy.prefixes.blocks() == 0

"""The worker's prefix ledger (what its cache holds) and the summaries it publishes of it."""

from __future__ import annotations

import msgspec

from llmq_core import prefixes, wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.settings import WorkerSettings
from llmq_worker.prefix_cache import PrefixLedger, PrefixReporter, SegmentedLRU, tokens_per_block
from tests.unit.worker.worker_fakes import make_request

HEADER = "".join(f"import module_{i}  # line {i}\n" for i in range(40))  # about 1.1 KB


def chain_of(prompt: str, tenant: str = "acme") -> tuple[int, ...]:
    request = msgspec.structs.replace(make_request(prompt=prompt), tenant_id=tenant)
    return prefixes.request_chain(request)


def test_a_recorded_prompt_matches_its_shared_blocks_and_nothing_else():
    ledger = PrefixLedger(budget_tokens=100_000)
    ledger.record(chain_of(HEADER + "def f():"), tokens_per_block=32)
    assert ledger.match(chain_of(HEADER + "class G:")) == len(HEADER) // PREFIX_BLOCK_BYTES
    assert ledger.match(chain_of("x" + HEADER)) == 0
    assert ledger.match(chain_of(HEADER, tenant="rival")) == 0  # tenant-scoped hashes


def test_the_budget_evicts_least_recently_used_prompts_tail_first():
    first, second = chain_of("a" * 4 * PREFIX_BLOCK_BYTES), chain_of("b" * 4 * PREFIX_BLOCK_BYTES)
    ledger = PrefixLedger(budget_tokens=6)
    ledger.record(first, tokens_per_block=1)
    ledger.record(second, tokens_per_block=1)  # 8 blocks of 1 token over a budget of 6: two of the first go
    assert (ledger.match(first), ledger.match(second), ledger.tokens, len(ledger)) == (2, 4, 6, 6)
    ledger.record(first, tokens_per_block=1)  # used again: now the second is the older one
    assert (ledger.match(first), ledger.match(second)) == (4, 2)


def test_a_header_used_again_outlives_a_run_of_one_off_tails():
    header, tails = chain_of("h" * 4 * PREFIX_BLOCK_BYTES), [chain_of(c * 3 * PREFIX_BLOCK_BYTES) for c in "wxyz"]
    ledger = PrefixLedger(budget_tokens=10)
    ledger.record(header, tokens_per_block=1)
    ledger.record(header, tokens_per_block=1)  # used again: protected (4 of the 8 its share allows)
    for tail in tails:  # 12 blocks seen once each: a plain LRU would have pushed the header out
        ledger.record(tail, tokens_per_block=1)
    assert (ledger.match(header), ledger.match(tails[-1]), ledger.tokens) == (4, 3, 10)
    assert ledger.match(tails[0]) == 0


def test_blocks_used_again_hold_at_most_their_share_so_a_new_header_still_enters():
    lru = SegmentedLRU(budget=10, protected_share=0.5)
    evicted = lru.use([(k, 1, True) for k in "abcdefgh"])  # all used again, but protected holds 5: a, b, c back
    assert evicted == [] and len(lru) == 8
    assert list(lru.keys_recent_first()) == list("hgfed") + list("cba")
    assert lru.use([(k, 1, False) for k in "xyz"]) == ["a"]  # probation's oldest go first
    assert lru.use([(k, 1, False) for k in "uvw"]) == ["b", "c", "x"]
    assert "h" in lru and "u" in lru and "a" not in lru


def test_a_discarded_key_gives_back_its_weight_and_evicts_nothing():
    lru = SegmentedLRU(budget=4)
    lru.use([("a", 2, False), ("b", 2, True)])
    lru.discard("b")
    lru.discard("missing")
    assert (lru.total, "b" in lru) == (2, False)
    assert lru.use([("c", 2, False)]) == [] and lru.total == 4


def test_a_summary_names_the_most_recently_used_blocks_first_within_its_bound():
    ledger = PrefixLedger(budget_tokens=100)
    old, new = chain_of("o" * 3 * PREFIX_BLOCK_BYTES), chain_of("n" * 2 * PREFIX_BLOCK_BYTES)
    ledger.record(old, 1)
    ledger.record(new, 1)
    assert ledger.summary(10) == [new[0], new[1], old[0], old[1], old[2]]
    assert ledger.summary(3) == [new[0], new[1], old[0]]


def test_tokens_per_block_is_the_prompts_tokens_per_byte():
    request = make_request(prompt="x" * 512)
    assert tokens_per_block(request, prompt_tokens=128) == 32
    assert tokens_per_block(make_request(prompt=""), prompt_tokens=0) == 0


def test_settings_turn_the_ledger_off_or_scope_it():
    assert PrefixLedger.from_settings(WorkerSettings(prefix_cache=False)) is None
    shared = PrefixLedger.from_settings(WorkerSettings(prefix_cache_scope="shared", prefix_cache_budget_tokens=7))
    assert (shared.tenant_scoped, shared.budget_tokens) == (False, 7)


def test_the_reporter_sends_once_there_is_something_and_then_once_per_interval():
    ledger = PrefixLedger(budget_tokens=100)
    reporter = PrefixReporter(ledger, worker_id="w1", model="m", interval_ms=1000, max_blocks=2, channel="c")
    assert reporter.due(0) is None  # nothing held
    ledger.record(chain_of("z" * 3 * PREFIX_BLOCK_BYTES), 1)
    summary = reporter.due(10)
    assert summary == wire.PrefixSummary(
        worker_id="w1", model="m", block_bytes=PREFIX_BLOCK_BYTES, blocks=ledger.summary(2), sent_ms=10
    )
    assert reporter.due(1009) is None
    assert reporter.due(1010) is not None

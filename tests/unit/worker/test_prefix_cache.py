"""The worker's prefix ledger (what its cache holds) and the summaries it publishes of it."""

from __future__ import annotations

import msgspec

from llmq_core import prefixes, wire
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.settings import WorkerSettings
from llmq_worker.prefix_cache import PrefixLedger, PrefixReporter, tokens_per_block
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

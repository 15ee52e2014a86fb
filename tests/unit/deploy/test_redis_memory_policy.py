"""Which Redis memory settings services warn about: no budget, or a policy that may evict state without a TTL."""

import pytest

from llmq_core.redis_client import memory_policy_warning


def test_no_budget_is_warned_about():
    assert "no maxmemory" in memory_policy_warning(0, "volatile-lru")


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_policies_that_may_evict_job_state_are_warned_about(policy):
    assert policy in memory_policy_warning(1 << 30, policy)


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-lfu", "volatile-ttl", "volatile-random", "noeviction"])
def test_a_budget_with_a_policy_that_spares_keys_without_a_ttl_is_fine(policy):
    assert memory_policy_warning(1 << 30, policy) is None

from bench.prompts import cut_prompts
from llmq_cli.demo import percentile


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50, 95, 99)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0


def test_prompts_are_cut_deterministically_within_bounds():
    first, again = cut_prompts(20, seed=5), cut_prompts(20, seed=5)
    assert first == again
    assert all(p.prompt.strip() and len(p.prompt) <= 3000 and p.max_tokens in (16, 32, 48, 64) for p in first)
    assert cut_prompts(20, seed=6) != first

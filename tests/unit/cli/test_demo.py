from llmq_bench.prompts import CHAT_QUESTIONS, cut_prompts
from llmq_cli.demo import chat_asks, code_asks, percentile, samples


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50, 95, 99)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0


def test_prompts_are_cut_deterministically_within_bounds():
    first, again = cut_prompts(20, seed=5), cut_prompts(20, seed=5)
    assert first == again
    assert all(p.prompt.strip() and len(p.prompt) <= 3000 and p.max_tokens in (16, 32, 48, 64) for p in first)
    assert cut_prompts(20, seed=6) != first


def test_code_asks_take_the_models_in_turn_and_samples_show_chat_answers_first():
    asks = code_asks(cut_prompts(3, seed=1, max_chars=800, max_tokens=(24,)), ["a", "b"])
    assert [a.model for a in asks] == ["a", "b", "a"] and all(a.max_tokens == 24 for a in asks)
    chats = chat_asks(CHAT_QUESTIONS[:3], "a", max_tokens=48)
    answers = [(asks[0], "code"), (chats[0], "Paris"), (chats[1], "def"), (chats[2], "56")]
    assert [text for _, text in samples(answers, 3)] == ["Paris", "def", "code"]
    assert [text for _, text in samples(answers[:2], 3)] == ["Paris", "code"]

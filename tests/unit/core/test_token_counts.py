"""Prompt tokens with each model's own tokenizer (llmq_core.token_counts), on a word-level tokenizer built in code."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from llmq_core import requests
from llmq_core.settings import Settings
from llmq_core.token_counts import BYTES, TokenizerCounter, counter_of, load_counters
from llmq_core.wire import ChatMessage

VOCAB = {"[unk]": 0, "<s>": 1, "<eot>": 2, "hello": 3, "world": 4, "user": 5, "assistant": 6, ":": 7}
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
    "{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
)


def word_tokenizer(bos: bool = False) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[unk]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "<eot>"])
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


def test_bytes_count_utf8_bytes_and_the_byte_models_chat_rendering():
    assert BYTES.prompt("héllo") == 6
    assert BYTES.chat([ChatMessage(role="user", content="hi")]) == len("<|user|>\nhi\n<|assistant|>\n")


def test_a_prompt_counts_the_special_tokens_its_tokenizer_adds():
    assert TokenizerCounter(word_tokenizer()).prompt("hello world hello") == 3
    assert TokenizerCounter(word_tokenizer(bos=True)).prompt("hello world") == 3


def test_a_chat_is_counted_through_its_template_with_the_special_tokens():
    counter = TokenizerCounter(word_tokenizer(bos=True), TEMPLATE, {"bos_token": "<s>", "eos_token": "<eot>"})
    # <s> user : hello world <eot> <s> assistant :  (the template's tokens only: no second BOS from the processor)
    assert counter.chat([ChatMessage(role="user", content="hello world")]) == 9


def test_a_chat_without_a_template_counts_the_byte_models_rendering_with_the_tokenizer():
    counter = TokenizerCounter(word_tokenizer())
    assert counter.chat([ChatMessage(role="user", content="hello")]) == counter.prompt(
        "<|user|>\nhello\n<|assistant|>\n"
    )


def test_a_chat_the_template_refuses_is_a_400_on_messages():
    counter = TokenizerCounter(word_tokenizer(), TEMPLATE, {"bos_token": "<s>", "eos_token": "<eot>"})
    with pytest.raises(requests.RequestError) as raised:
        requests.count_prompt(counter, messages=[ChatMessage(role="system", content="hello")])
    assert raised.value.status == 400 and raised.value.param == "messages"
    assert "no system turns" in raised.value.message


def test_from_a_checkpoint_directory_with_its_template_file_and_special_tokens(tmp_path):
    word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "<eot>"}))
    counter = TokenizerCounter.from_path(tmp_path)
    assert counter.chat([ChatMessage(role="user", content="hello")]) == 8
    assert TokenizerCounter.from_path(tmp_path / "tokenizer.json").prompt("hello world") == 2


def test_load_counters_takes_settings_paths_and_leaves_unreadable_ones_to_bytes(tmp_path, caplog):
    word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "broken.json").write_text("{not json")
    settings = Settings(
        models={
            "dir": str(tmp_path / "none"),
            "tokenizers": {"mine": str(tmp_path / "tokenizer.json"), "broken": str(tmp_path / "broken.json")},
        },
    )
    counters = load_counters(settings)
    assert counter_of(counters, "mine").prompt("hello world") == 2
    assert counter_of(counters, "broken") is BYTES
    assert counter_of(counters, "smollm2-135m-instruct") is BYTES  # not installed under models_dir
    assert "broken" in caplog.text and "smollm2-135m-instruct" in caplog.text


def test_the_shared_check_of_a_kafka_request_counts_with_the_models_tokenizer():
    rules = requests.Rules(windows={"mine": 4}, counters={"mine": TokenizerCounter(word_tokenizer())})
    request = _request("hello world hello", max_tokens=1)
    requests.check_request(request, rules)  # 3 + 1 tokens fit 4, though its 17 bytes would not
    with pytest.raises(requests.RequestError) as raised:
        requests.check_request(_request("hello world hello", max_tokens=2), rules)
    assert raised.value.code == "context_length_exceeded"


def _request(prompt: str, max_tokens: int):
    from llmq_core import wire

    return wire.GenerationRequest(
        request_id="r",
        model="mine",
        prompt=prompt,
        sampling=wire.SamplingParams(max_tokens=max_tokens),
        created_ms=0,
        deadline_ms=1,
        reply_to=wire.HttpReply(instance_id="a"),
    )

"""llmq-tiny: a small Llama-style model built in code (fixed seed, random weights) with ByT5's byte tokenizer.

Nothing is downloaded. Its ids are ``llmq_core.tokenizer``'s (byte ``b`` -> ``b + 3``); its chat template renders exactly
like ``llmq_core.tokenizer.render_chat``. The output rows of the special ids (pad, eos, unk) are zero, so greedy decoding
always runs to ``max_tokens`` (random weights would otherwise hit EOS at random) while sampling still may stop early.
"""

from __future__ import annotations

import torch
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

from llmq_core.models import LLMQ_TINY
from llmq_core.tokenizer import BYTE_OFFSET, EOS_ID, PAD_ID, VOCAB_SIZE

SEED = 20_241_117
# Jinja twin of llmq_core.tokenizer.render_chat: one "<|role|>" header line per message, then the assistant's header.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tiny_config(**sizes) -> LlamaConfig:
    """2 layers, hidden 64, 4 heads, 8192 positions, ByT5 vocabulary of 259; ``sizes`` replace some (a larger twin
    over the same vocabulary and special ids: bench/gpu_check_vllm.py)."""
    shape = dict(hidden_size=64, intermediate_size=128, max_position_embeddings=LLMQ_TINY.context_window)
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        **{**shape, **sizes},
    )


def tiny_tokenizer() -> ByT5Tokenizer:
    """ByT5's byte tokenizer without sentinel ids (ids == llmq_core.tokenizer.encode) and llmq's chat template."""
    tokenizer = ByT5Tokenizer(extra_ids=0)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_llmq_tiny() -> tuple[LlamaForCausalLM, ByT5Tokenizer]:
    """The llmq-tiny model (eval mode, float32, CPU) and its tokenizer; the same weights on every call."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(tiny_config())
    with torch.no_grad():
        model.lm_head.weight[:BYTE_OFFSET].zero_()
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval(), tiny_tokenizer()

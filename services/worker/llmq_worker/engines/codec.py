"""Prompt text -> token ids and generated ids -> text for the tokenizer of a transformers checkpoint (shared by the
``transformers`` and ``vllm`` engines, so both count and render prompts the same way)."""

from __future__ import annotations

from transformers import ByT5Tokenizer

from llmq_core import tokenizer as byte_tokenizer
from llmq_core.wire import GenerationRequest
from llmq_worker import logprobs
from llmq_worker.text import ChoiceText, ResultBudget, WindowDetokenizer


class TextCodec:
    """Prompt text -> ids and ids -> text for one tokenizer. Byte-level (ByT5 ids) tokenizers use llmq_core's exact
    byte tokenizer; any other uses its own chat template, ``decode`` and special tokens, counted as the API pods count
    (:mod:`llmq_core.token_counts`): a prompt gets the special tokens the tokenizer adds itself, a chat those of its
    template."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.byte_level = isinstance(tokenizer, ByT5Tokenizer)
        # id -> its bytes in logprob entries
        self.token_bytes = logprobs.byte_token_bytes if self.byte_level else logprobs.Vocabulary(tokenizer)

    def text_size(self, token_id: int) -> int:
        """UTF-8 bytes ``token_id`` adds to the text (special tokens: none, as they are skipped)."""
        special = logprobs.BYTE_SPECIALS if self.byte_level else self.token_bytes.special
        return 0 if token_id in special else len(self.token_bytes(token_id))

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (chat rendered with the model's template)."""
        if self.byte_level:
            text = (
                byte_tokenizer.render_chat(request.messages) if request.messages is not None else request.prompt or ""
            )
            return byte_tokenizer.encode(text)
        if request.messages is not None and getattr(self._tokenizer, "chat_template", None):
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            text = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self._tokenizer(text, add_special_tokens=False).input_ids
        if request.messages is not None:
            return self._tokenizer(byte_tokenizer.render_chat(request.messages)).input_ids
        return self._tokenizer(request.prompt or "").input_ids

    def choice(self, stops: list[str], budget: ResultBudget, logprobs: int | None = None) -> ChoiceText:
        """The text path of one choice (``budget``: its request's result bytes; ``logprobs``: its request's
        SamplingParams.logprobs): exact byte detokenization, or a window detokenizer over ``decode``."""
        asked = logprobs is not None
        if self.byte_level:
            return ChoiceText(stops, budget=budget, logprobs=asked)
        return ChoiceText(
            stops,
            WindowDetokenizer(lambda ids: self._tokenizer.decode(ids, skip_special_tokens=True)),
            budget,
            logprobs=asked,
        )

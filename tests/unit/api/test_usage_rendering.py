"""Cached prompt tokens in each API's usage, read back by the real SDKs' own types."""

import anthropic.types
import msgspec
import openai.types

from llmq_core import api_formats, wire
from tests.unit.api.fakes import final


def cached_result() -> wire.FinalResult:
    return msgspec.structs.replace(final("r", "hi"), usage=wire.Usage.of(40, 2, cached_tokens=32))


def test_openai_usage_reports_cached_prompt_tokens_in_prompt_tokens_details():
    usage = openai.types.CompletionUsage.model_validate(api_formats.usage_dict(cached_result().usage))
    assert (usage.prompt_tokens, usage.total_tokens, usage.prompt_tokens_details.cached_tokens) == (40, 42, 32)


def test_anthropic_usage_counts_cache_reads_apart_from_input_tokens():
    usage = anthropic.types.Usage.model_validate(api_formats.anthropic_usage(cached_result()))
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (8, 32, 2)


def test_cached_tokens_never_exceed_the_prompt():
    assert wire.Usage.of(5, 1, cached_tokens=9).cached_tokens == 5

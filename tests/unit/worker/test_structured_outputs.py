"""llmq-sim's answers to structured outputs: a small instance of the schema (the real model's tests are in
tests/system/test_structured_outputs.py)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import msgspec
import pytest

from llmq_core import structured, tokenizer
from llmq_core.wire import SamplingParams
from llmq_worker.engines.simulated import replay_tokens
from tests.structured_cases import SCHEMAS, chat


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_llmq_sim_answers_a_valid_instance_of_each_schema(name):

    request = chat(name, 1.0, structured.json_schema_constraint(name, SCHEMAS[name]), max_tokens=256)  # byte tokens
    text = bytes(t - tokenizer.BYTE_OFFSET for t in replay_tokens(request)).decode()
    jsonschema.validate(json.loads(text), SCHEMAS[name])


async def test_llmq_tiny_decodes_every_schema_under_its_byte_vocabulary_with_n_choices():
    """The grammar over llmq's byte vocabulary (llmq-tiny: random weights, so the mask alone makes it JSON), two
    choices per request, each with its own matcher."""
    pytest.importorskip("torch")
    from llmq_worker.engine import FinalEvent
    from llmq_worker.engines.tiny_model import build_llmq_tiny
    from llmq_worker.engines.transformers_engine import TransformersEngine

    model, tokenizer_ = build_llmq_tiny()
    engine = TransformersEngine(model, tokenizer_, max_concurrent_sequences=8, context_window=8192)
    try:
        requests = [
            msgspec.structs.replace(
                chat(name, 1.0, structured.json_schema_constraint(name, schema), max_tokens=200),
                model="llmq-tiny",
                sampling=SamplingParams(max_tokens=200, temperature=1.0, n=2),
            )
            for name, schema in SCHEMAS.items()
        ]
        for request in requests:
            engine.submit(request)
        finals: dict[str, FinalEvent] = {}
        async with asyncio.timeout(120):
            while len(finals) < len(requests):
                finals.update({e.request_id: e for e in await engine.next_events() if isinstance(e, FinalEvent)})
    finally:
        await engine.close()
    for name, schema in SCHEMAS.items():
        assert [c.finish_reason for c in finals[name].choices] == ["stop", "stop"], finals[name]
        for choice in finals[name].choices:
            jsonschema.validate(json.loads(choice.text), schema)


async def test_a_worker_without_constrained_decoding_refuses_constrained_requests():
    pytest.importorskip("torch")
    from llmq_worker.engine import InvalidRequest
    from llmq_worker.engines.tiny_model import build_llmq_tiny
    from llmq_worker.engines.transformers_engine import TransformersEngine

    model, tokenizer_ = build_llmq_tiny()
    engine = TransformersEngine(model, tokenizer_, max_concurrent_sequences=2, constrained_decoding=False)
    try:
        request = chat("c", 0.0, structured.json_schema_constraint("enum", SCHEMAS["enum"]))
        with pytest.raises(InvalidRequest) as refused:
            engine.submit(msgspec.structs.replace(request, model="llmq-tiny"))
        assert refused.value.param == "response_format"
    finally:
        await engine.close()

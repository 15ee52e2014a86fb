"""llmq-sim's answers to structured outputs: a small instance of the schema (the real model's tests are in
tests/system/test_structured_outputs.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from llmq_core import structured, tokenizer
from llmq_worker.engines.simulated import replay_tokens
from tests.structured_cases import SCHEMAS, chat


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_llmq_sim_answers_a_valid_instance_of_each_schema(name):

    request = chat(name, 1.0, structured.json_schema_constraint(name, SCHEMAS[name]), max_tokens=256)  # byte tokens
    text = bytes(t - tokenizer.BYTE_OFFSET for t in replay_tokens(request)).decode()
    jsonschema.validate(json.loads(text), SCHEMAS[name])

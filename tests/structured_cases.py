"""Schemas and requests of the structured-outputs tests (the real model's, tests/system, and llmq-sim's, tests/unit)."""

from __future__ import annotations

from llmq_bench.prompts import CLAIM_SCHEMA, CLAIM_TEXT
from llmq_core.models import SMOLLM2_135M_INSTRUCT
from llmq_core.wire import ChatMessage, GenerationRequest, HttpReply, SamplingParams, Structured

# A claims-classification schema like seed 000's nightly job, and the shapes people constrain to most.
CLAIM = CLAIM_SCHEMA
SCHEMAS = {
    "enum": {"enum": ["yes", "no", "unsure"]},
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}, "claim": CLAIM},
                "required": ["age", "claim"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
        "additionalProperties": False,
    },
    "array": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    "claim": CLAIM,
}
PROMPT = CLAIM_TEXT
MAX_TOKENS = 64  # every instance of the schemas above closes well within it (no free-length strings or lists)


def chat(
    request_id: str,
    temperature: float,
    constraint: Structured | None,
    *,
    tools=None,
    tool_choice="",
    max_tokens=MAX_TOKENS,
):
    return GenerationRequest(
        request_id=request_id,
        model=SMOLLM2_135M_INSTRUCT.name,
        endpoint="chat.completions",
        messages=[ChatMessage(role="user", content=PROMPT)],
        sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7),
        created_ms=0,
        deadline_ms=1 << 60,
        reply_to=HttpReply(instance_id="pod"),
        structured=constraint,
        tools=tools,
        tool_choice=tool_choice,
    )

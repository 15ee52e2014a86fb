"""Structured outputs: the grammar a request's answer is constrained to (``wire.Structured``), checked before Kafka,
and the tool calls read back from an answer.

The grammar library is llguidance: the API pods and the batcher check a schema with ``LLMatcher.validate_grammar``
(no tokenizer, no torch); the workers compile it against their tokenizer and mask each step's logits
(``llmq_worker.grammars``). JSON is generated compact (no free whitespace), so a model cannot spend its tokens on
blanks. A constraint cannot make an answer finish: one cut off by ``max_tokens`` ends ``length`` and does not parse.
"""

from __future__ import annotations

import json
from typing import Any

from llguidance import LLMatcher

from llmq_core import wire
from llmq_core.constants import JSON_OBJECT, JSON_SCHEMA, STRUCTURED_KINDS, TOOL, TOOL_CHOICE_NONE
from llmq_core.settings import ApiSettings

DEFAULT_MAX_SCHEMA_BYTES = ApiSettings.model_fields["max_json_schema_bytes"].default
ANY_OBJECT = {"type": "object"}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # OpenAI: parameters omitted
# llguidance's JSON options: compact separators, no whitespace between tokens (x-guidance in the schema is overridden)
_COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def compact(value: Any) -> str:
    """``value`` as compact JSON text (what a schema's size is counted on and what travels in the wire)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def grammar(structured: wire.Structured) -> str:
    """The llguidance grammar of ``structured``; raises ValueError when its schema is no JSON object."""
    schema: Any = ANY_OBJECT if structured.kind == JSON_OBJECT else json.loads(structured.schema or "{}")
    if not isinstance(schema, dict):
        raise ValueError("the schema must be a JSON object")
    return LLMatcher.grammar_from_json_schema(schema, overrides=_COMPACT)


def compile_error(structured: wire.Structured) -> str | None:
    """Why the grammar library cannot compile ``structured`` (None: it can)."""
    if structured.kind not in STRUCTURED_KINDS:
        return f"unknown structured kind {structured.kind[:40]!r} (one of {', '.join(STRUCTURED_KINDS)})"
    try:
        return LLMatcher.validate_grammar(grammar(structured)) or None
    except (ValueError, RecursionError) as exc:
        return str(exc) or type(exc).__name__


def problem(structured: wire.Structured, max_schema_bytes: int) -> tuple[str, str] | None:
    """Why ``structured`` cannot constrain an answer, as (message, error code): a schema larger than
    ``max_schema_bytes`` (UTF-8) or one the grammar library cannot compile; None when it can."""
    size = len(structured.schema.encode())
    if size > max_schema_bytes:
        return f"the JSON schema is {size} bytes; at most {max_schema_bytes} are allowed", "schema_too_large"
    error = compile_error(structured)
    if error is not None:
        return f"the JSON schema cannot be used to constrain decoding: {error[:300]}", "invalid_schema"
    return None


def json_schema_constraint(name: str, schema: Any) -> wire.Structured:
    return wire.Structured(kind=JSON_SCHEMA, schema=compact(schema), name=name)


def tool_calls_schema(tools: list[wire.Tool], only: str = "", parallel: bool = True) -> dict:
    """The JSON Schema of the answer to a ``required`` (or, with ``only``, a named) tool_choice: a list of calls
    ``[{"name": ..., "arguments": {...}}]``, each an instance of its function's parameters; one call at most unless
    ``parallel``."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": parameters(tool)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
        if not only or tool.name == only
    ]
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {"type": "array", "items": items, "minItems": 1, **({} if parallel else {"maxItems": 1})}


def parameters(tool: wire.Tool) -> Any:
    """A function's arguments schema: its ``parameters``, or none at all (an empty object) when it gives none."""
    return json.loads(tool.parameters) if tool.parameters else NO_PARAMETERS


def tool_constraint(tools: list[wire.Tool], only: str = "", parallel: bool = True) -> wire.Structured:
    return wire.Structured(kind=TOOL, schema=compact(tool_calls_schema(tools, only, parallel)), name=only)


def may_call_tools(request: wire.GenerationRequest) -> bool:
    """Whether an answer to ``request`` may be tool calls: it has tools and a tool_choice other than ``none`` (auto,
    required or a named function). Its text is then parsed for calls at the end, so a stream holds it back."""
    return bool(request.tools) and request.tool_choice not in ("", TOOL_CHOICE_NONE)


def parse_tool_calls(text: str, tools: list[wire.Tool], id_prefix: str) -> list[wire.ToolCall] | None:
    """The calls ``text`` makes of ``tools`` (None: it is no call): a JSON list of ``{"name", "arguments"}`` objects,
    one such object, or either inside ``<tool_call>...</tool_call>`` (the form many chat templates teach). Every name
    must be one of ``tools`` and every ``arguments`` a JSON object; ids are ``<id_prefix>_<i>``."""
    body = text.strip()
    if body.startswith("<tool_call>"):
        body = "[" + ",".join(part.split("</tool_call>")[0] for part in body.split("<tool_call>")[1:]) + "]"
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    calls = value if isinstance(value, list) else [value]
    names = {tool.name for tool in tools}
    parsed = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or call.get("name") not in names:
            return None
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        parsed.append(wire.ToolCall(id=f"{id_prefix}_{i}", name=call["name"], arguments=compact(arguments)))
    return parsed or None


def tools_prompt(tools: list[wire.Tool]) -> str:
    """What a chat template that cannot render tools gets instead, as a system message: the functions and the form of
    a call."""
    listed = "\n".join(
        compact({"name": t.name, "description": t.description, "parameters": parameters(t)}) for t in tools
    )
    return (
        "You may call these functions:\n"
        f"{listed}\n"
        'To call functions, answer only with a JSON list: [{"name": <function name>, "arguments": <arguments object>}]'
    )

"""response_format and tools on /v1/chat/completions: what becomes the wire's constraint, and the 400s (naming the
field) of a schema the grammar library cannot compile or one past the size bound, before anything reaches Kafka."""

from __future__ import annotations

import json

import pytest

from llmq_api.errors import ApiError
from llmq_api.validation import parse_chat
from llmq_core import requests, structured, wire
from llmq_core.constants import JSON_OBJECT, JSON_SCHEMA, TOOL
from tests.builders import generation_request

MODELS = {"m": 1000}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop"}},
]


def chat(**fields) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}
    ).encode()


def rejected(body: bytes, **limits) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_chat(body, MODELS, **limits)
    return caught.value


def test_json_object_and_json_schema_become_the_wire_constraint():
    assert parse_chat(chat(response_format={"type": "text"}), MODELS).structured is None
    assert parse_chat(chat(response_format={"type": "json_object"}), MODELS).structured == wire.Structured(
        kind=JSON_OBJECT
    )
    spec = {"name": "claim", "schema": {"enum": ["a", "b"]}, "strict": True}
    valid = parse_chat(chat(response_format={"type": "json_schema", "json_schema": spec}), MODELS)
    assert valid.structured == wire.Structured(kind=JSON_SCHEMA, schema='{"enum":["a","b"]}', name="claim")


@pytest.mark.parametrize(
    "response_format, code",
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "invalid_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "(("}}}, "invalid_schema"),
        ({"type": "json_schema"}, "missing_required_parameter"),
        ({"type": "yaml"}, "invalid_value"),
    ],
)
def test_a_schema_that_does_not_compile_is_a_400_naming_response_format(response_format, code):
    error = rejected(chat(response_format=response_format))
    assert (error.status, error.param, error.code) == (400, "response_format", code)


def test_a_schema_past_the_size_bound_is_a_400_naming_response_format():
    schema = {"enum": ["x" * 200]}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert parse_chat(body, MODELS, max_schema_bytes=300).structured is not None
    error = rejected(body, max_schema_bytes=100)
    assert (error.status, error.param, error.code) == (400, "response_format", "schema_too_large")
    assert rejected(chat(tools=TOOLS), max_schema_bytes=10).param == "tools"


def test_tool_choices_required_and_named_constrain_to_the_functions_schemas():
    auto = parse_chat(chat(tools=TOOLS), MODELS)
    assert (auto.structured, auto.tool_choice, [t.name for t in auto.tools]) == (None, "auto", ["get_weather", "noop"])
    assert auto.tools[0].parameters == structured.compact(WEATHER)
    assert parse_chat(chat(tools=TOOLS, tool_choice="none"), MODELS).structured is None
    required = parse_chat(chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), MODELS)
    assert required.structured.kind == TOOL and json.loads(required.structured.schema)["maxItems"] == 1
    named = parse_chat(chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "noop"}}), MODELS)
    assert (named.tool_choice, named.structured.name) == ("function", "noop")
    assert json.loads(named.structured.schema)["items"]["properties"]["name"] == {"const": "noop"}


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
            "tools[0].function.parameters",
        ),
    ],
)
def test_tool_faults_are_400_naming_the_field(fields, param):
    error = rejected(chat(**fields))
    assert (error.status, error.param) == (400, param)


def test_tool_results_and_assistant_calls_are_accepted_in_the_next_turn():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
    ]
    valid = parse_chat(chat(messages=messages, tools=TOOLS), MODELS)
    assert valid.messages[1].tool_calls == [wire.ToolCall(id="call_1", name="get_weather", arguments='{"city":"Oslo"}')]
    assert (valid.messages[1].content, valid.messages[2].tool_call_id) == ("", "call_1")


def test_kafka_direct_requests_get_the_same_schema_checks():
    messages = [wire.ChatMessage(role="user", content="hi")]

    def checked(constraint: wire.Structured) -> requests.RequestError:
        request = generation_request(prompt=None, endpoint="chat.completions", messages=messages, structured=constraint)
        with pytest.raises(requests.RequestError) as caught:
            requests.check_request(request, requests.Rules())
        return caught.value

    bad = checked(wire.Structured(kind=JSON_SCHEMA, schema='{"type":"nope"}'))
    assert (bad.param, bad.code) == ("response_format", "invalid_schema")
    assert checked(wire.Structured(kind="xml")).param == "response_format"
    assert checked(wire.Structured(kind=TOOL, schema='{"type":"array"}')).param == "tools"


def test_tool_calls_parse_from_the_constrained_form_and_tagged_forms():
    tools = [wire.Tool(name="f")]
    assert structured.parse_tool_calls('[{"name":"f","arguments":{"a":1}}]', tools, "c") == [
        wire.ToolCall(id="c_0", name="f", arguments='{"a":1}')
    ]
    tagged = '<tool_call>{"name":"f","arguments":{}}</tool_call>\n<tool_call>{"name":"f","arguments":{}}</tool_call>'
    assert [c.id for c in structured.parse_tool_calls(tagged, tools, "c")] == ["c_0", "c_1"]
    for text in ("hello", '{"name":"g","arguments":{}}', '[{"name":"f","arguments":3}]', "[]"):
        assert structured.parse_tool_calls(text, tools, "c") is None

"""JSON nested deeper than the decoder's recursion limit is a client mistake (400 / a line error), never a 500: it used to
escape as RecursionError from msgspec, in an ignored unknown field as much as in a typed one."""

import json

import pytest

from llmq_api.batch_jobs.inputs import Limits, check_input
from llmq_api.errors import ApiError
from llmq_api.validation import parse_chat, parse_completion
from llmq_core.models import BUILTIN_MODELS

MODELS = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
DEPTH = 100_000
DEEP = b"[" * DEPTH + b"]" * DEPTH


@pytest.mark.parametrize(
    "parse,fields",
    [
        (parse_completion, b'"prompt":"a","unknown":'),
        (parse_completion, b'"prompt":"a","user":'),
        (parse_chat, b'"messages":[{"role":"user","content":"a"}],"unknown":'),
    ],
)
def test_deeply_nested_body_is_a_400(parse, fields):
    with pytest.raises(ApiError) as info:
        parse(b'{"model":"llmq-sim",' + fields + DEEP + b"}", MODELS)
    assert info.value.status == 400 and info.value.code in ("invalid_json", "invalid_type")


def test_deeply_nested_batch_lines_are_line_errors():
    limits = Limits(max_lines=10, max_line_bytes=1_000_000)
    good = json.dumps(
        {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "llmq-sim", "prompt": "hi"}}
    ).encode()
    deep_line = b'{"custom_id":"b","x":' + DEEP + b"}"
    deep_body = (
        b'{"custom_id":"c","method":"POST","url":"/v1/completions","body":{"model":"llmq-sim","x":' + DEEP + b"}}"
    )
    checked = check_input(b"\n".join([good, deep_line, deep_body]), "/v1/completions", MODELS, limits)
    assert [(e.code, e.line) for e in checked.errors] == [("invalid_json_line", 2), ("invalid_json_line", 3)]
    assert [x.custom_id for x in checked.lines if x.valid is not None] == ["a"]

"""Validation of batch input files: structural faults fail the batch with line numbers, body faults stay per line."""

import json

import pytest

from llmq_api.batch_jobs.inputs import MAX_REPORTED_ERRORS, InputChecker, Limits, check_input
from llmq_core.models import BUILTIN_MODELS

MODELS = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
CHAT = "/v1/chat/completions"
LIMITS = Limits(max_lines=100, max_line_bytes=10_000)


def line(custom_id="a", url=CHAT, method="POST", **body) -> str:
    body = body or {"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def check(text: str | bytes, endpoint: str = CHAT, limits: Limits = LIMITS):
    return check_input(text.encode() if isinstance(text, str) else text, endpoint, MODELS, limits)


def codes(checked) -> list[tuple[str, str | None, int | None]]:
    return [(e.code, e.param, e.line) for e in checked.errors]


def test_bom_crlf_and_blank_lines_are_accepted_and_lines_keep_their_physical_numbers():
    text = "\ufeff" + line("a") + "\r\n\r\n   \n" + line("b") + "\r\n"
    checked = check(text)
    assert checked.errors == []
    assert [(x.line, x.custom_id) for x in checked.lines] == [(1, "a"), (4, "b")]
    assert all(x.valid is not None and x.error is None for x in checked.lines)


@pytest.mark.parametrize(
    "bad,code,param",
    [
        ("not json", "invalid_json_line", None),
        ("[1, 2]", "invalid_json_line", None),
        (json.dumps({"method": "POST", "url": CHAT, "body": {}}), "missing_custom_id", "custom_id"),
        (line("has space"), "invalid_custom_id", "custom_id"),
        (line("x" * 65), "invalid_custom_id", "custom_id"),
        (json.dumps({"custom_id": 7, "method": "POST", "url": CHAT, "body": {}}), "invalid_custom_id", "custom_id"),
        (line("b", method="GET"), "invalid_method", "method"),
        (line("b", url="/v1/completions"), "mismatched_url", "url"),
        (json.dumps({"custom_id": "b", "method": "POST", "url": CHAT}), "invalid_body", "body"),
        (json.dumps({"custom_id": "b", "method": "POST", "url": CHAT, "body": "text"}), "invalid_body", "body"),
    ],
)
def test_structural_faults_name_code_param_and_line(bad, code, param):
    checked = check("\n".join([line("a"), "", bad]))
    assert codes(checked) == [(code, param, 3)]


def test_custom_id_rules_accept_the_full_alphabet_at_64_chars():
    custom_id = ("Az09_-" * 11)[:64]
    assert check(line(custom_id)).errors == []


def test_duplicates_are_reported_at_the_second_occurrence():
    checked = check("\n".join([line("a"), line("b"), line("a")]))
    assert codes(checked) == [("duplicate_custom_id", "custom_id", 3)]


def test_every_structural_fault_is_listed_not_only_the_first():
    checked = check("\n".join(["{", line("a"), line("a", method="PUT"), "nope"]))
    assert [e.line for e in checked.errors] == [1, 3, 4]


def test_a_body_that_fails_the_endpoints_validation_errs_alone():
    text = "\n".join(
        [
            line("ok"),
            line("bad-model", model="nope", messages=[{"role": "user", "content": "x"}]),
            line("bad-temp", model="llmq-sim", temperature=9, messages=[{"role": "user", "content": "x"}]),
            line("streamed", model="llmq-sim", stream=True, messages=[{"role": "user", "content": "x"}]),
        ]
    )
    checked = check(text)
    assert checked.errors == []
    by_id = {x.custom_id: x for x in checked.lines}
    assert by_id["ok"].valid.model == "llmq-sim"
    assert by_id["bad-model"].error.code == "model_not_found" and by_id["bad-model"].model == "nope"
    assert by_id["bad-temp"].error.param == "temperature"
    assert by_id["streamed"].error.param == "stream"


def test_completions_endpoint_uses_the_completions_validation():
    text = json.dumps(
        {
            "custom_id": "c",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "llmq-sim", "prompt": "abc", "max_tokens": 3},
        }
    )
    checked = check(text, endpoint="/v1/completions")
    assert checked.lines[0].valid.prompt == "abc" and checked.lines[0].valid.sampling.max_tokens == 3


def test_limits_on_lines_and_line_bytes():
    too_many = check("\n".join(line(f"l{i}") for i in range(4)), limits=Limits(max_lines=3, max_line_bytes=10_000))
    assert codes(too_many) == [("too_many_lines", None, 4)]
    long_line = line("b", model="llmq-sim", messages=[{"role": "user", "content": "x" * 500}])
    too_long = check("\n".join([line("a"), long_line]), limits=Limits(max_lines=10, max_line_bytes=300))
    assert codes(too_long) == [("line_too_large", None, 2)]


def test_an_empty_file_fails():
    assert codes(check("\n \r\n")) == [("empty_file", None, None)]


def test_invalid_utf8_is_a_structural_fault():
    checked = check(line("a").encode() + b"\n" + b'{"custom_id": "\xff"}')
    assert [(e.code, e.line) for e in checked.errors] == [("invalid_json_line", 2)]


def test_reported_errors_are_capped_with_a_count_of_the_rest():
    checked = check(
        "\n".join("x" for _ in range(MAX_REPORTED_ERRORS + 5)), limits=Limits(max_lines=1000, max_line_bytes=100)
    )
    reported = checked.reported_errors()
    assert len(reported) == MAX_REPORTED_ERRORS + 1
    assert reported[-1].code == "too_many_errors" and "5 more" in reported[-1].message


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_streamed_in_chunks_the_file_checks_as_it_does_whole(chunk_bytes):
    data = ("\ufeff" + line("a") + "\r\n\n" + line("b") + "\n{oops\n" + line("a") + "\n" + line("c")).encode()
    limits = Limits(max_lines=10, max_line_bytes=1000)
    whole = check_input(data, "/v1/chat/completions", MODELS, limits)
    checker = InputChecker("/v1/chat/completions", MODELS, limits)
    lines = [x for start in range(0, len(data), chunk_bytes) for x in checker.feed(data[start : start + chunk_bytes])]
    lines += checker.end()
    assert (
        [(x.line, x.custom_id) for x in lines]
        == [(x.line, x.custom_id) for x in whole.lines]
        == [(1, "a"), (3, "b"), (6, "c")]
    )
    assert checker.checked.errors == whole.errors and len(whole.errors) == 2


def test_a_line_too_long_is_never_held_whole():
    checker = InputChecker("/v1/chat/completions", MODELS, Limits(max_lines=10, max_line_bytes=300))
    for _ in range(50):
        checker.feed(b"x" * 1000)
        assert len(checker._buffer) <= 301
    assert checker.feed(b"\n" + line("ok").encode() + b"\n")[0].custom_id == "ok"
    (error,) = checker.checked.errors
    assert (error.code, error.line) == ("line_too_large", 1) and "50000 bytes" in error.message


def test_batch_lines_apply_the_stop_limit_of_the_endpoints():
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "llmq-sim", "prompt": "x", "stop": ["s" * 20]},
    }
    data = json.dumps(line).encode()
    tight = check_input(data, "/v1/completions", MODELS, Limits(max_lines=10, max_line_bytes=10_000, max_stop_bytes=10))
    loose = check_input(data, "/v1/completions", MODELS, Limits(max_lines=10, max_line_bytes=10_000))
    assert tight.lines[0].error is not None and tight.lines[0].error.param == "stop"
    assert loose.lines[0].error is None


def test_a_chat_lines_response_format_gets_the_http_checks_and_bound():
    messages = [{"role": "user", "content": "hi"}]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    good = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    bad = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "nope"}}}
    text = "\n".join(
        line(cid, model="llmq-sim", messages=messages, response_format=fmt)
        for cid, fmt in (("good", good), ("bad", bad))
    )
    checked = check(text)
    good_line, bad_line = checked.lines
    assert good_line.valid.structured.kind == "json_schema"
    assert (bad_line.error.param, bad_line.error.code) == ("response_format", "invalid_schema")
    (small,) = check(
        line("good", model="llmq-sim", messages=messages, response_format=good),
        limits=Limits(max_lines=100, max_line_bytes=10_000, max_schema_bytes=10),
    ).lines
    assert (small.error.param, small.error.code) == ("response_format", "schema_too_large")

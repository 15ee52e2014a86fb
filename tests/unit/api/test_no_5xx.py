"""Property: no header value and no body value, of any shape, makes a 5xx on the generation endpoints, /v1/files or
/v1/batches (issue 12 item 7). Values include integers past Python's 4,300-digit conversion limit, non-ASCII digits and
arbitrary latin-1 header text. The in-process app runs with the fake worker, and /v1/files and /v1/batches store into
memory (:class:`MemoryJobStore` and a ``memory://`` file store).
"""

import json
import uuid
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmq_api import pod
from llmq_core.settings import Settings
from tests.unit.api.fakes import MemoryJobStore
from tests.unit.api.test_fuzz import bodies, chat, completion, json_values

BIG = "9" * 5000
EXAMPLES = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BIG_NUMBERS = [BIG, "-" + BIG, "0" * 5000 + "1", BIG + ".5", "1e99999", str(2**64)]
big_numbers = st.integers(0, len(BIG_NUMBERS) - 1).map(BIG_NUMBERS.__getitem__)  # a short repr in reports
header_text = (
    big_numbers
    | st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=30)
    | big_numbers
    | st.sampled_from(["²", "١٢", "+5", " 7 ", "0"])
    | st.integers(-(2**70), 2**70).map(str)
)
HEADERS = [
    "x-llmq-timeout-ms",
    "x-stainless-read-timeout",
    "x-llmq-class",
    "idempotency-key",
    "content-length",
    "content-type",
    "authorization",
    "traceparent",
    "x-request-id",
]
headers = st.dictionaries(st.sampled_from(HEADERS[:1] * 4 + HEADERS), header_text, max_size=2).map(
    lambda values: {name: value.encode() for name, value in values.items()}
)
FIELDS = ["logit_bias"] * 5 + [
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "logit_bias",
    "temperature",
    "top_p",
    "stop",
    "logprobs",
    "top_logprobs",
    "best_of",
    "prompt",
    "messages",
    "stream_options",
]


@st.composite
def with_big_values(draw, body: bytes) -> bytes:
    """``body`` (when it is a non-empty JSON object) with one field set to a big number, or a logit_bias keyed by one
    (mostly)."""
    if not (body.startswith(b"{") and body.endswith(b"}") and len(body) > 2) or draw(st.integers(0, 3)) == 0:
        return body
    number = draw(big_numbers)
    value = f'{{"{number}": 1}}' if draw(st.booleans()) else number
    return body[:-1] + f', "{draw(st.sampled_from(FIELDS))}": {value}}}'.encode()


@pytest.fixture
async def app(make_app, monkeypatch):
    store = MemoryJobStore()
    monkeypatch.setattr(pod, "JobStore", lambda redis, log=None: store)
    client, *_ = await make_app(
        Settings(api={"max_body_bytes": 64_000}, jobs={"files_url": f"memory://no5xx-{uuid.uuid4().hex}"})
    )
    return client


def _check(response) -> None:
    event(f"status {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


@EXAMPLES
@given(data=st.data(), endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]), extra=headers)
async def test_no_value_makes_a_5xx_on_the_generation_endpoints(app, data, endpoint, extra):
    valid = (chat if endpoint.endswith("chat/completions") else completion).map(lambda body: json.dumps(body).encode())
    content = data.draw((valid | bodies(endpoint)).flatmap(with_big_values))
    _check(
        await app.post(
            endpoint,
            content=content,
            headers={"content-type": "application/json", "x-llmq-timeout-ms": "2000", **extra},
        )
    )


def _batch_line(custom_id: str, body: bytes) -> bytes:
    return b'{"custom_id": "%s", "method": "POST", "url": "/v1/completions", "body": %s}' % (custom_id.encode(), body)


@st.composite
def input_files(draw) -> bytes:
    """A batch input file: lines with fuzzed request bodies, or arbitrary bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=60))
    count = draw(st.integers(1, 3))
    lines = completion.map(lambda body: json.dumps(body).encode()) | bodies("/v1/completions")
    return b"\n".join(_batch_line(f"line-{i}", draw(lines.flatmap(with_big_values))) for i in range(count))


create_fields = {
    "endpoint": st.sampled_from(["/v1/completions", "/v1/completions", "/v1/chat/completions", "x"]),
    "completion_window": st.sampled_from(["24h", "24h", "90s", BIG + "h", "1" * 10 + "s", "x"]),
}


@EXAMPLES
@given(data=st.data(), extra=headers, purpose=st.sampled_from(["batch"] * 4 + ["fine-tune", "", BIG]))
async def test_no_value_makes_a_5xx_on_files_and_batches(app, data, extra, purpose):
    upload = await app.post(
        "/v1/files", files={"file": ("in.jsonl", data.draw(input_files()))}, data={"purpose": purpose}, headers=extra
    )
    _check(upload)
    file_id = upload.json()["id"] if upload.status_code == 200 else data.draw(st.text(max_size=8) | big_numbers)
    create = data.draw(
        st.fixed_dictionaries({"input_file_id": st.just(file_id), **create_fields}, optional={"metadata": json_values})
    )
    if data.draw(st.booleans()):
        create[data.draw(st.sampled_from(sorted(create)))] = data.draw(json_values)
    content = data.draw(with_big_values(json.dumps(create).encode()))
    created = await app.post("/v1/batches", content=content, headers={"content-type": "application/json", **extra})
    _check(created)
    batch_id = created.json()["id"] if created.status_code == 200 else file_id
    file_id, batch_id = quote(file_id, safe=""), quote(batch_id, safe="")
    query = {"limit": data.draw(header_text), "after": data.draw(header_text), "purpose": data.draw(header_text)}
    for method, path in [
        ("GET", "/v1/files"),
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("GET", "/v1/batches"),
        ("GET", f"/v1/batches/{batch_id}"),
        ("POST", f"/v1/batches/{batch_id}/cancel"),
        ("DELETE", f"/v1/files/{file_id}"),
    ]:
        _check(await app.request(method, path, params=query if "{" not in path else None, headers=extra))

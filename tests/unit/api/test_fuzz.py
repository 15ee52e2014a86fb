"""Fuzz: hypothesis-made bodies and headers against the in-process app. A client mistake is never a 5xx.

Bodies are mostly valid requests with one field (or the whole body) swapped for arbitrary JSON, so the fuzz reaches
every validation step and the worker path, not only the JSON parser.
"""

import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
MODELS = ["llmq-sim", "llmq-tiny", "llmq-sim", "gpt-nope"]
text = st.text(min_size=1, max_size=30)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "developer"]),
        "content": text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
    }
)
common = {
    "max_tokens": st.none() | st.integers(1, 30),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "n": st.integers(1, 3),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "user": text,
    "stop": st.none() | text | st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "stream": st.booleans(),
    "presence_penalty": st.just(0),
    "frequency_penalty": st.just(0),
}
completion = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS), "prompt": text | st.lists(text, min_size=1, max_size=1)}, optional=common
)
chat = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS), "messages": st.lists(message, min_size=1, max_size=3)},
    optional={**common, "max_completion_tokens": st.integers(1, 30)},
)
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "echo",
    "logprobs",
    "best_of",
    "suffix",
    "tools",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "user",
]


@st.composite
def bodies(draw, endpoint: str) -> bytes:
    body = draw(chat if endpoint.endswith("chat/completions") else completion)
    if body.get("stream") and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    how = draw(st.sampled_from(["valid", "one field", "one field", "whole body", "bytes"]))
    if how == "one field":
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    elif how == "whole body":
        body = draw(json_values)
    elif how == "bytes":
        return draw(st.binary(max_size=40))
    return json.dumps(body, allow_nan=True).encode()


headers = st.fixed_dictionaries(
    {},
    optional={
        "x-llmq-class": st.sampled_from(["interactive", "near_interactive", "deferred", "", "vip"]),
        "x-llmq-timeout-ms": st.sampled_from(["1", "100", "0", "-1", "1.5", "x", "99999999999999999999"]),
        "idempotency-key": st.sampled_from(["k1", "k2", "", " ", "a" * 300]),
        "authorization": st.sampled_from(["Bearer llmq-dev-free-key", "Bearer nope"]),
        "content-type": st.sampled_from(["application/json; charset=utf-8", "text/plain"]),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]), extra=headers)
async def test_no_body_or_header_makes_a_5xx(setup, data, endpoint, extra):
    client, _, _, _ = setup
    content = data.draw(bodies(endpoint))
    response = await client.post(
        endpoint, content=content, headers={"content-type": "application/json", "x-llmq-timeout-ms": "2000", **extra}
    )
    event(f"status {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]

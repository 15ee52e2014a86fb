"""Anthropic's Messages API through the official SDK (anthropic 2.15) against the in-process app: the SDK's own
requests, its parsing of our responses, streams and errors (fixtures in conftest.py: a fake worker replays the
prompt's last message and answers ``finish_reason: length``)."""

from __future__ import annotations

import asyncio

import anthropic
import httpx2
import msgspec
import pytest

from llmq_api.anthropic_format import ANTHROPIC_VERSIONS
from llmq_api.anthropic_messages import IGNORED, READ, REFUSED_UNLESS_OFF
from llmq_api.auth import KeyStore, Principal
from llmq_core import constants, wire
from llmq_core.api_formats import ANTHROPIC_ERROR_TYPES as ERROR_TYPES
from llmq_core.settings import Settings
from tests.unit.api.conftest import DEV_AUTH

USER = [{"role": "user", "content": "hello"}]


def sdk(pod_app, **options) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=pod_app), base_url="http://api")
    options.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(api_key="llmq-dev-key", base_url="http://api", http_client=http, **options)


@pytest.fixture
async def client(setup):
    http, pod, worker, redis = setup
    async with sdk(http._transport.app) as client:
        yield client, http, pod, worker


async def test_the_pinned_sdk_sends_a_version_we_accept():
    """The SDK's version is what it sends on every request; the docs' examples send 2023-06-01."""
    assert anthropic._constants.ANTHROPIC_API_VERSION in ANTHROPIC_VERSIONS and "2023-06-01" in ANTHROPIC_VERSIONS


async def test_a_message_through_the_sdk(client):
    client, _, pod, worker = client
    raw = await client.messages.with_raw_response.create(
        model="llmq-sim",
        max_tokens=7,
        system=[{"type": "text", "text": "be brief"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}],
        metadata={"user_id": "u1"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
        extra_headers={"x-llmq-class": "near_interactive"},
    )
    message = await raw.parse()
    assert message.content[0].text == "hellohe" and message.role == "assistant" and message.type == "message"
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert message.usage.output_tokens == 7 and message.usage.service_tier == "standard"
    assert raw.headers["request-id"] == message.id == raw.headers["x-request-id"] and message.id.startswith("msg-")
    (request,) = worker.produced
    assert request.api_format == constants.ANTHROPIC and request.endpoint == "chat.completions"
    assert request.messages == [
        wire.ChatMessage(role="system", content="be brief"),
        wire.ChatMessage(role="user", content="hello"),
    ]
    assert (request.sampling.temperature, request.sampling.top_p, request.traffic_class) == (
        0.5,
        0.9,
        "near_interactive",
    )
    assert message.usage.input_tokens == request.prompt_tokens > 0


async def test_service_tier_standard_only_runs_a_paid_key_at_the_free_tier(client):
    client, _, _, worker = client
    auto = await client.messages.create(model="llmq-sim", max_tokens=2, messages=USER)
    standard = await client.messages.create(model="llmq-sim", max_tokens=2, messages=USER, service_tier="standard_only")
    assert [r.tier for r in worker.produced] == ["paid", "free"]
    assert (auto.usage.service_tier, standard.usage.service_tier) == ("priority", "standard")


async def test_a_stream_through_the_sdk(client):
    client, _, _, _ = client
    async with client.messages.stream(model="llmq-sim", max_tokens=9, messages=USER) as stream:
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert message.content[0].text == "hellohell" and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 9


async def test_the_stream_events_in_order(setup):
    http, _, _, _ = setup
    body = {"model": "llmq-sim", "max_tokens": 4, "messages": [{"role": "user", "content": "é😀"}], "stream": True}
    response = await http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    frames = [frame.split(b"\n", 1) for frame in response.content.split(b"\n\n") if frame]
    names = [name.removeprefix(b"event: ").decode() for name, _ in frames]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    payloads = [msgspec.json.decode(data.removeprefix(b"data: ")) for _, data in frames]
    assert "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta") == "é😀é😀"
    assert payloads[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


async def test_a_stop_sequence_is_named(setup):
    http, pod, worker, _ = setup
    worker.choice = wire.Choice(index=0, text="hel", finish_reason="stop", stop_sequence="lo")  # a stop matched
    response = await http.post(
        "/v1/messages",
        json={"model": "llmq-sim", "max_tokens": 5, "messages": USER, "stop_sequences": ["lo"]},
        headers={"anthropic-version": "2023-06-01"},
    )
    body = response.json()
    assert (body["stop_reason"], body["stop_sequence"], body["content"]) == (
        "stop_sequence",
        "lo",
        [{"type": "text", "text": "hel"}],
    )
    assert worker.produced[0].sampling.stop == ["lo"]


async def test_count_tokens_uses_the_models_tokenizer(client):
    client, _, pod, worker = client
    counted = await client.messages.count_tokens(model="llmq-sim", messages=USER, system="be brief")
    message = await client.messages.create(model="llmq-sim", max_tokens=1, messages=USER, system="be brief")
    assert counted.input_tokens == message.usage.input_tokens > 0


async def test_models_in_each_sdks_shape(setup):
    http, _, _, _ = setup
    async with sdk(http._transport.app) as client:
        page = await client.models.list()
        one = await client.models.retrieve("llmq-sim")
    assert "llmq-sim" in [m.id for m in page.data] and (one.id, one.type) == ("llmq-sim", "model")
    openai_list = (await http.get("/v1/models")).json()
    assert openai_list["object"] == "list" and openai_list["data"][0]["object"] == "model"
    missing = await http.get("/v1/models/nope", headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("version", "says"), [(None, "it is missing"), ("2022-01-01", "got '2022-01-01'")], ids=["missing", "unknown"]
)
async def test_a_missing_or_unknown_version_is_a_400_naming_the_header(setup, version, says):
    http, _, worker, _ = setup
    headers = {"anthropic-version": version} if version else {}
    response = await http.post(
        "/v1/messages", json={"model": "llmq-sim", "max_tokens": 1, "messages": USER}, headers=headers
    )
    error = response.json()
    assert response.status_code == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"].startswith(
        "anthropic-version"
    )
    assert says in error["error"]["message"] and not worker.produced


async def test_x_api_key_and_bearer_are_the_same_keys(setup):
    http, _, _, _ = setup
    body = {"model": "llmq-sim", "max_tokens": 1, "messages": USER}
    version = {"anthropic-version": "2023-06-01"}
    by_bearer = await http.post("/v1/messages", json=body, headers={**version, **DEV_AUTH})
    by_key = await http.post("/v1/messages", json=body, headers={**version, "x-api-key": "llmq-dev-key"})
    wrong = await http.post("/v1/messages", json=body, headers={**version, "x-api-key": "nope"})
    assert (by_bearer.status_code, by_key.status_code, wrong.status_code) == (200, 200, 401)
    assert wrong.json()["error"]["type"] == "authentication_error"


async def test_an_idempotent_retry_replays_the_stored_message(client):
    client, _, _, worker = client
    headers = {"Idempotency-Key": "anthropic-retry-1"}
    first = await client.messages.create(model="llmq-sim", max_tokens=3, messages=USER, extra_headers=headers)
    again = await client.messages.with_raw_response.create(
        model="llmq-sim", max_tokens=3, messages=USER, extra_headers=headers
    )
    assert (await again.parse()).id == first.id and again.headers["idempotent-replayed"] == "true"
    assert len(worker.produced) == 1


async def test_a_stored_result_is_an_anthropic_message(client):
    client, http, _, _ = client
    message = await client.messages.create(model="llmq-sim", max_tokens=3, messages=USER)
    stored = (await http.get(f"/v1/requests/{message.id}")).json()
    assert stored["response"]["type"] == "message" and stored["response"]["content"][0]["text"] == "hel"


def test_every_status_of_the_table_has_an_anthropic_type():
    """docs/api.md's table of the OpenAI routes' statuses (429 is chosen by cause, 499 is never sent)."""
    statuses = {400, 401, 403, 404, 408, 409, 410, 413, 415, 422, 431, 500, 503, 504}
    assert set(ERROR_TYPES) == statuses


async def test_a_body_over_the_limit_is_413_request_too_large(make_app):
    http, _, _, _ = await make_app(Settings(api={"max_body_bytes": 100}))
    response = await http.post(
        "/v1/messages",
        json={"model": "llmq-sim", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 200}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"


# --- the error table (docs/anthropic.md): each row through the app, in Anthropic's shape ---------------------------

V = {"anthropic-version": "2023-06-01"}
BODY = {"model": "llmq-sim", "max_tokens": 2, "messages": USER}


def anthropic_error_of(response) -> tuple[int, str, str]:
    body = response.json()
    assert body["type"] == "error" and body["request_id"] == response.headers.get("request-id")
    return response.status_code, body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({**BODY, "max_tokens": None}, "max_tokens"),
        ({k: v for k, v in BODY.items() if k != "max_tokens"}, "max_tokens"),
        ({**BODY, "frequency_penalty": 1}, "frequency_penalty"),
        ({**BODY, "tools": [{"name": "t", "input_schema": {}}]}, "tools"),
        ({**BODY, "thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        (
            {**BODY, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({**BODY, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({**BODY, "messages": [*USER, {"role": "assistant", "content": "pre"}]}, "messages[1].role"),
        ({**BODY, "messages": []}, "messages"),
        ({**BODY, "temperature": 1.5}, "temperature"),
        ({**BODY, "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({**BODY, "max_tokens": 100_000}, "max_tokens"),
    ],
)
async def test_400_invalid_request_error_names_the_parameter(setup, body, names):
    http, _, worker, _ = setup
    status, kind, message = anthropic_error_of(await http.post("/v1/messages", json=body, headers=V))
    assert (status, kind) == (400, "invalid_request_error") and message.startswith(f"{names}: ")
    assert not worker.produced


async def test_415_for_another_content_type(setup):
    http, _, _, _ = setup
    response = await http.post("/v1/messages", content=b"{}", headers={**V, "content-type": "text/plain"})
    assert anthropic_error_of(response)[:2] == (415, "invalid_request_error")


async def test_404_for_an_unknown_model(setup):
    http, _, _, _ = setup
    response = await http.post("/v1/messages", json={**BODY, "model": "nope"}, headers=V)
    assert anthropic_error_of(response)[:2] == (404, "not_found_error")


async def test_403_permission_error_for_a_class_the_key_may_not_use(make_app):
    keys = KeyStore({"k-batch": Principal(tenant_id="t", classes=("deferred",))})
    http, _, _, _ = await make_app(keys=keys)
    response = await http.post(
        "/v1/messages", json=BODY, headers={**V, "x-api-key": "k-batch", "x-llmq-class": "interactive"}
    )
    assert anthropic_error_of(response)[:2] == (403, "permission_error")


async def test_422_for_a_reused_idempotency_key(setup):
    http, _, _, _ = setup
    headers = {**V, "Idempotency-Key": "anthropic-422"}
    assert (await http.post("/v1/messages", json=BODY, headers=headers)).status_code == 200
    response = await http.post("/v1/messages", json={**BODY, "max_tokens": 3}, headers=headers)
    assert anthropic_error_of(response)[:2] == (422, "invalid_request_error")


async def test_504_timeout_error_at_the_deadline(setup):
    http, _, worker, _ = setup
    worker.silent = True
    response = await http.post("/v1/messages", json=BODY, headers={**V, "x-llmq-timeout-ms": "50"})
    assert anthropic_error_of(response)[:2] == (504, "timeout_error")
    assert response.headers["x-should-retry"] == "false"


async def test_shed_load_is_529_overloaded_error_with_retry_after(setup):
    http, pod, _, _ = setup
    pod.registry.max_waiters = 0  # the pod is full: admission's 429 of shed load
    response = await http.post("/v1/messages", json=BODY, headers=V)
    assert anthropic_error_of(response)[:2] == (529, "overloaded_error")
    assert response.headers["retry-after"] == "1" and response.headers["x-should-retry"] == "true"


async def test_a_tenants_limit_is_429_rate_limit_error_with_retry_after(make_app):
    keys = KeyStore({"k-capped": Principal(tenant_id="capped", requests_per_min=1)})
    http, _, _, redis = await make_app(keys=keys)
    redis.take_reply = [0, 1200, 1]  # the shared bucket script: refused, 1.2 s until the requests bucket holds one
    response = await http.post("/v1/messages", json=BODY, headers={**V, "x-api-key": "k-capped"})
    assert anthropic_error_of(response)[:2] == (429, "rate_limit_error")
    assert response.headers["retry-after"] == "2" and response.headers["x-should-retry"] == "true"


async def test_409_conflict_error_when_the_system_canceled_it(setup):
    http, _, worker, _ = setup
    worker.outcome = wire.Outcome.CANCELED
    response = await http.post("/v1/messages", json=BODY, headers=V)
    assert anthropic_error_of(response)[:2] == (409, "conflict_error")


async def test_503_api_error_while_the_pod_is_not_accepting(setup):
    http, pod, _, _ = setup
    pod.listener.subscribed = False  # results could not reach it
    response = await http.post("/v1/messages", json=BODY, headers=V)
    assert anthropic_error_of(response)[:2] == (503, "api_error") and response.headers["retry-after"]


async def test_500_api_error_for_a_failed_request(setup):
    http, _, worker, _ = setup
    worker.error = wire.ErrorInfo(type="engine_error", message="the engine failed")
    response = await http.post("/v1/messages", json=BODY, headers=V)
    assert anthropic_error_of(response) == (500, "api_error", "the engine failed")


async def test_an_error_after_the_first_byte_is_an_error_event(setup):
    http, _, worker, _ = setup
    worker.silent = True
    response = await http.post("/v1/messages", json={**BODY, "stream": True}, headers={**V, "x-llmq-timeout-ms": "50"})
    last = response.content.strip().split(b"\n\n")[-1]
    name, _, data = last.partition(b"\n")
    assert response.status_code == 200 and name == b"event: error"
    assert msgspec.json.decode(data.removeprefix(b"data: "))["error"]["type"] == "timeout_error"


async def test_the_sdk_raises_its_own_error_classes(setup):
    http, pod, _, _ = setup
    async with sdk(http._transport.app) as client:
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=1, messages=USER)
        pod.registry.max_waiters = 0
        with pytest.raises(anthropic.OverloadedError):
            await client.messages.create(model="llmq-sim", max_tokens=1, messages=USER)


# --- every key of the pinned SDK's MessageCreateParams is read, ignored, or refused ----------------------------------

SAMPLES = {  # a value the SDK could send for each key (the refused ones: a value that turns them on)
    "cache_control": {"type": "ephemeral"},
    "container": "container_1",
    "diagnostics": {"previous_message_id": "msg_1"},
    "inference_geo": "us",
    "metadata": {"user_id": "u"},
    "output_config": {"format": {"type": "json_schema", "schema": {}}},
    "service_tier": "auto",
    "speed": "fast",
    "stop_sequences": ["zz"],
    "system": "be brief",
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "tool_choice": {"type": "auto"},
    "tools": [{"name": "t", "input_schema": {"type": "object"}}],
    "stream": False,
}
HEADER_KEYS = {"user_profile_id", "workspace_id"}  # the SDK sends these as anthropic-* headers, not in the body


def sdk_keys() -> set[str]:
    """The top-level keys of the pinned SDK's MessageCreateParams (streaming or not)."""
    from anthropic.types import message_create_params as params

    typed = params.MessageCreateParamsNonStreaming
    return set(typed.__required_keys__ | typed.__optional_keys__)


def test_every_sdk_key_has_a_kind():
    keys = sdk_keys() - HEADER_KEYS
    assert keys <= READ | IGNORED | REFUSED_UNLESS_OFF, keys - (READ | IGNORED | REFUSED_UNLESS_OFF)
    assert keys - {"model", "messages", "max_tokens"} <= set(SAMPLES)


@pytest.mark.parametrize("key", sorted(set(SAMPLES)))
async def test_each_sdk_key_is_read_ignored_or_a_400_naming_it(setup, key):
    http, _, _, _ = setup
    response = await http.post("/v1/messages", json={**BODY, key: SAMPLES[key]}, headers=V)
    if key in REFUSED_UNLESS_OFF:
        assert anthropic_error_of(response)[:2] == (400, "invalid_request_error")
        assert anthropic_error_of(response)[2].startswith(f"{key}: ")
    else:
        assert response.status_code == 200, response.text


async def test_the_header_keys_are_ignored(client):
    client, _, _, _ = client
    message = await client.messages.create(
        model="llmq-sim", max_tokens=1, messages=USER, user_profile_id="p", workspace_id="w"
    )
    assert message.type == "message"


def test_output_config_format_is_the_wire_constraint_checked_as_response_format():
    from llmq_api.anthropic_messages import parse_messages
    from llmq_api.errors import ApiError

    def parsed(output_config: dict, **limits):
        body = msgspec.json.encode({**BODY, "output_config": output_config})
        return parse_messages(body, {"llmq-sim": 8192}, **limits)

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    valid = parsed({"format": {"type": "json_schema", "schema": schema}})
    assert valid.structured.kind == constants.JSON_SCHEMA and msgspec.json.decode(valid.structured.schema) == schema
    assert parsed({}).structured is None
    for config, code in [
        ({"format": {"type": "json_schema", "schema": {"type": "nope"}}}, "invalid_schema"),
        ({"format": {"type": "text"}}, "invalid_value"),
    ]:
        with pytest.raises(ApiError) as refused:
            parsed(config)
        assert (refused.value.status, refused.value.param, refused.value.code) == (400, "output_config.format", code)
    with pytest.raises(ApiError) as too_large:
        parsed({"format": {"type": "json_schema", "schema": schema}}, max_schema_bytes=10)
    assert (too_large.value.param, too_large.value.code) == ("output_config.format", "schema_too_large")


async def test_a_keyed_stream_resumes_in_anthropic_s_events_after_its_last_event_id(setup):
    http, pod, worker, redis = setup
    worker.silent = True
    headers = {"anthropic-version": "2023-06-01", "idempotency-key": "story-1"}
    body = {"model": "llmq-sim", "max_tokens": 5, "messages": USER, "stream": True}
    first = asyncio.create_task(http.post("/v1/messages", json=body, headers=headers))
    while not worker.produced:
        await asyncio.sleep(0.01)
    (request,) = worker.produced
    log = redis.lists.setdefault(constants.stream_log_key(request.request_id), [])
    for seq, (offset, text) in enumerate([(0, "he"), (2, "ll")]):
        chunk = wire.TokenChunk(
            request_id=request.request_id,
            tenant_id=request.tenant_id,
            index=0,
            text=text,
            seq=seq,
            sent_ms=0,
            offset=offset,
        )
        log.append(wire.encode(chunk))
        assert pod.registry.dispatch(chunk)
    resumed = asyncio.create_task(http.post("/v1/messages", json=body, headers=headers | {"last-event-id": "3"}))
    async with asyncio.timeout(5):
        while not pod.metrics.registry.get_sample_value("llmq_api_stream_resumes_total", {"outcome": "resumed"}):
            await asyncio.sleep(0.01)
    result = wire.FinalResult.for_request(
        request,
        wire.Outcome.SUCCEEDED,
        finished_ms=1,
        worker_id="w",
        choices=[wire.Choice(index=0, text="hello", finish_reason="length")],
    )
    pod.registry.dispatch(result)
    redis.data[constants.result_key(request.request_id)] = wire.encode(result)
    first, resumed = await asyncio.gather(first, resumed)
    events = [
        [
            (name.removeprefix(b"event: ").decode(), msgspec.json.decode(data.removeprefix(b"data: ")))
            for name, data in (line for line in (f.split(b"\n")[-2:] for f in r.content.split(b"\n\n") if f))
        ]
        for r in (first, resumed)
    ]
    texts = ["".join(e["delta"].get("text", "") for name, e in es if name == "content_block_delta") for es in events]
    assert texts == ["hello", "lo"]  # the client had "hel" (id 3)
    assert events[0][0][0] == "message_start" and "message_start" not in {name for name, _ in events[1]}
    assert events[1][-1][0] == "message_stop"

"""The app end to end in-process (httpx ASGI transport), with a fake producer standing in for Kafka and the workers
(fixtures in conftest.py)."""

import msgspec
import pytest

from llmq_core import constants, wire
from llmq_core.settings import Settings
from tests.builders import UNREADABLE_BODIES, chat_body
from tests.unit.api.conftest import published


async def test_completion_200_with_usage_and_request_id(setup):
    client, pod, worker, _ = setup
    response = await client.post(
        "/v1/completions",
        json={"model": "llmq-sim", "prompt": "abc", "max_tokens": 5},
        headers={"x-llmq-class": "near_interactive", "authorization": "Bearer llmq-dev-key"},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("cmpl-") and response.headers["x-request-id"] == body["id"]
    assert body["choices"][0]["text"] == "abcab"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    (request,) = worker.produced
    assert request.request_id == body["id"] and request.traffic_class == "near_interactive"
    assert len(pod.registry) == 0


async def test_chat_stream_events(setup):
    client, _, _, _ = setup
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body("hey", 5, stream=True, stream_options={"include_usage": True}),
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [f[6:] for f in response.content.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    chunks = [msgspec.json.decode(f) for f in frames[:-1]]
    assert {c["id"] for c in chunks} == {response.headers["x-request-id"]}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "heyhe"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_worker_invalid_request_error_is_400(setup):
    client, _, worker, _ = setup
    worker.error = wire.ErrorInfo(type="invalid_request_error", message="bad stop", code="bad_stop")
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "abc"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "bad stop",
        "type": "invalid_request_error",
        "param": None,
        "code": "bad_stop",
    }


async def test_deadline_is_504_and_publishes_cancel(setup):
    client, pod, worker, redis = setup
    worker.silent = True
    response = await client.post(
        "/v1/completions", json={"model": "llmq-sim", "prompt": "abc"}, headers={"x-llmq-timeout-ms": "50"}
    )
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    ((channel, data),) = await published(redis)
    assert channel == constants.REDIS_CANCELS_CHANNEL
    assert wire.decode(data) == wire.Cancel(request_id=response.headers["x-request-id"], reason="deadline_exceeded")
    assert len(pod.registry) == 0


async def test_streamed_deadline_ends_with_error_event_then_done(setup):
    client, _, worker, redis = setup
    worker.silent = True
    response = await client.post(
        "/v1/completions",
        json={"model": "llmq-sim", "prompt": "abc", "stream": True},
        headers={"x-llmq-timeout-ms": "50"},
    )
    frames = [f[6:] for f in response.content.split(b"\n\n") if f]
    assert response.status_code == 200 and frames[-1] == b"[DONE]"
    assert msgspec.json.decode(frames[-2])["error"]["code"] == "deadline_exceeded"
    assert len(await published(redis)) == 1


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        *UNREADABLE_BODIES,
        ({"json": {"model": "nope", "prompt": "a"}}, 404, "model"),
        ({"json": {"model": "llmq-sim", "prompt": "a", "n": "2"}}, 400, "n"),
        ({"json": {"model": "llmq-sim", "prompt": "x" * 3000}}, 413, None),
        (
            {"json": {"model": "llmq-sim", "prompt": "a"}, "headers": {"x-llmq-timeout-ms": "soon"}},
            400,
            "x-llmq-timeout-ms",
        ),
        ({"json": {"model": "llmq-sim", "prompt": "a"}, "headers": {"x-llmq-class": "vip"}}, 400, "x-llmq-class"),
    ],
)
async def test_client_errors_never_reach_the_producer(setup, kwargs, status, param):
    client, _, worker, _ = setup
    response = await client.post("/v1/completions", **kwargs)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param
    assert response.headers["x-request-id"].startswith("cmpl-")
    assert worker.produced == []


async def test_chunked_body_over_the_limit_is_413(setup):
    client, _, worker, _ = setup

    async def chunks():
        for _ in range(30):
            yield b"x" * 100

    response = await client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and worker.produced == []


async def test_models_health_readiness_metrics(setup):
    client, pod, _, _ = setup
    models = (await client.get("/v1/models")).json()
    assert {m["id"]: m["context_window"] for m in models["data"]} == {
        "llmq-sim": 8192,
        "llmq-tiny": 8192,
        "smollm2-135m-instruct": 8192,
    }
    assert (await client.get("/v1/models/llmq-tiny")).json()["id"] == "llmq-tiny"
    assert (await client.get("/v1/models/nope")).status_code == 404
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    pod.listener.subscribed = False  # a shared dependency lost: still ready (on purpose), but degraded
    readyz = await client.get("/readyz")
    assert readyz.status_code == 200 and readyz.json()["replies_subscription"] is False
    assert readyz.json()["status"] == "degraded" and readyz.json()["failing"] == ["redis"]
    assert (await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a"})).status_code == 503
    pod.listener.subscribed = True
    pod.draining = True
    assert (await client.get("/readyz")).status_code == 503
    await client.post("/v1/completions", json={"model": "nope", "prompt": "a"})
    text = pod.metrics.render().decode()  # served apart from the API (--metrics-port)
    assert 'llmq_api_requests_total{endpoint="completions",outcome="rejected",region="local",status="404"} 1.0' in text
    assert (
        'llmq_api_requests_total{endpoint="completions",outcome="unavailable",region="local",status="503"} 1.0' in text
    )
    assert 'llmq_api_in_flight{region="local"} 0.0' in text
    assert (await client.get("/metrics")).status_code == 404  # never on the port clients reach


async def test_the_model_catalogue_needs_an_api_key(setup):
    client, _, _, _ = setup
    for path in ("/v1/models", "/v1/models/llmq-tiny"):
        response = await client.get(path, headers={"authorization": ""})
        assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key"), path
        response = await client.get(path, headers={"authorization": "Bearer nope"})
        assert response.status_code == 401, path


async def test_draining_pod_answers_503_with_retry_after(setup):
    client, pod, worker, _ = setup
    pod.draining = True
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1" and worker.produced == []


async def test_unknown_route_is_an_openai_style_404(setup):
    client, _, _, _ = setup
    response = await client.get("/v1/nothing")
    assert response.status_code == 404 and set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_unexpected_error_is_a_clean_500(unexpected_error):
    assert unexpected_error.status_code == 500
    assert unexpected_error.json()["error"]["type"] == "server_error" and "bug" not in unexpected_error.text


async def test_an_admitted_request_carries_its_predicted_wait_and_counts_as_queued_until_reported(setup):
    client, pod, _, _ = setup
    load = wire.ModelLoad(
        classes={"interactive:paid": wire.QueueLoad(depth=30, backlog_drained_per_s=20.0)},
        workers=1,
        slots=8,
        worker_seen_ms=pod.clock.now_ms(),
        capacity_per_s=32.0,
    )
    pod.saturation.reports = [
        wire.BatcherSaturation(batcher_id="b", sent_ms=pod.clock.now_ms() - 1, models={"llmq-sim": load})
    ]
    response = await client.post(
        "/v1/completions",
        json={"model": "llmq-sim", "prompt": "abc", "max_tokens": 5},
        headers={"authorization": "Bearer llmq-dev-key"},
    )
    # 30 ahead at 20/s in cycles of 250 ms (8 slots at the promised 32/s): 5 at once, then 6 cycles from 50 ms on
    assert response.status_code == 200 and response.headers[constants.HTTP_PREDICTED_WAIT_MS] == "1550"
    assert pod.saturation.current.predict("llmq-sim", "interactive:paid").queued == 31


async def test_each_admitted_requests_measured_queue_wait_is_compared_with_its_prediction(setup):
    client, pod, worker, _ = setup
    load = wire.ModelLoad(
        classes={"interactive:paid": wire.QueueLoad(depth=30, backlog_drained_per_s=20.0)},
        workers=1,
        slots=8,
        worker_seen_ms=pod.clock.now_ms(),
        capacity_per_s=32.0,
    )
    pod.saturation.reports = [
        wire.BatcherSaturation(batcher_id="b", sent_ms=pod.clock.now_ms() - 1, models={"llmq-sim": load})
    ]
    body = {"model": "llmq-sim", "prompt": "abc", "max_tokens": 5}
    for queued_ms in (1200, 4000):  # predicted 1550 ms both times: within 50% of 1.2 s, then 2450 ms under 4 s
        worker.timings = wire.Timings(queued_ms=queued_ms, ttft_ms=queued_ms + 10, total_ms=queued_ms + 50)
        assert (await client.post("/v1/completions", json=body)).headers[constants.HTTP_PREDICTED_WAIT_MS] == "1550"
    worker.timings = None  # a result without timings (answered without an engine's): nothing to compare
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    text = pod.metrics.render().decode()
    labels = 'priority_class="interactive:paid",region="local"'
    for verdict in ("within", "under"):
        assert f'llmq_api_admission_predictions_total{{{labels},verdict="{verdict}"}} 1.0' in text
    assert f"llmq_api_admission_prediction_error_seconds_count{{{labels}}} 2.0" in text
    assert f"llmq_api_admission_prediction_error_seconds_sum{{{labels}}} 2.8" in text


async def test_a_pod_whose_files_url_names_no_known_filesystem_is_refused_before_it_serves(make_app):
    with pytest.raises(ValueError, match="nosuch"):  # main turns it into exit status 2
        await make_app(Settings(jobs={"files_url": "nosuch://files"}))

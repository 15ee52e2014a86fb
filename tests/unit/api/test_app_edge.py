"""The app's edge in-process: API keys, classes, per-class deadlines, admission 429s, idempotency, stored results."""

import asyncio

import msgspec
import pytest

from llmq_api.auth import KeyEntry, KeyStore
from llmq_core import constants, wire
from llmq_core.settings import Settings
from tests.unit.api.fakes import chunk, final

BODY = {"model": "llmq-sim", "prompt": "abc", "max_tokens": 5}
FREE = {"authorization": "Bearer llmq-dev-free-key"}


def sse_frames(response) -> list[bytes]:
    """The data of each event of a stream."""
    return [line[len(b"data: ") :] for line in response.content.split(b"\n") if line.startswith(b"data: ")]


def sse_ids(response) -> list[int]:
    """The ids of the events of a stream that carry one."""
    return [int(line[len(b"id: ") :]) for line in response.content.split(b"\n") if line.startswith(b"id: ")]


@pytest.mark.parametrize(
    "headers", [{"authorization": ""}, {"authorization": "Bearer wrong"}, {"authorization": "Token llmq-dev-key"}]
)
async def test_missing_or_unknown_key_is_401_before_anything_else(setup, headers):
    client, _, worker, _ = setup
    response = await client.post("/v1/completions", content=b"not json", headers={**headers, "content-type": "x"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert worker.produced == []


async def test_keys_map_to_tenant_and_tier(setup):
    client, _, worker, _ = setup
    assert (await client.post("/v1/completions", json=BODY)).status_code == 200
    assert (await client.post("/v1/completions", json=BODY, headers=FREE)).status_code == 200
    assert [(r.tenant_id, r.tier, r.traffic_class) for r in worker.produced] == [
        ("dev", "paid", "interactive"),
        ("dev-free", "free", "interactive"),
    ]


async def test_class_header_picks_among_the_allowed_classes(make_app):
    keys = KeyStore({})
    keys.add([KeyEntry(tenant="batchy", key="k-batch", classes=["near_interactive", "deferred"])])
    client, _, worker, _ = await make_app(keys=keys)
    auth = {"authorization": "Bearer k-batch"}
    assert (await client.post("/v1/completions", json=BODY, headers=auth)).status_code == 200
    assert (
        await client.post("/v1/completions", json=BODY, headers={**auth, "x-llmq-class": "deferred"})
    ).status_code == 200
    forbidden = await client.post("/v1/completions", json=BODY, headers={**auth, "x-llmq-class": "interactive"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "class_not_allowed"
    assert [r.traffic_class for r in worker.produced] == ["near_interactive", "deferred"]


@pytest.mark.parametrize(
    "traffic_class, header, expected_ms",
    [
        ("interactive", None, 30_000),
        ("interactive", "999999999", 600_000),
        ("near_interactive", None, 60_000),
        ("near_interactive", "1500", 1500),
        ("deferred", None, 3_600_000),
        ("deferred", "99999999999", 86_400_000),
    ],
)
async def test_each_class_has_its_default_and_maximum_timeout(setup, traffic_class, header, expected_ms):
    client, _, worker, _ = setup
    headers = {"x-llmq-class": traffic_class} | ({"x-llmq-timeout-ms": header} if header else {})
    assert (await client.post("/v1/completions", json=BODY, headers=headers)).status_code == 200
    (request,) = worker.produced
    assert request.deadline_ms - request.created_ms == expected_ms


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "1e3", "soon", ""])
async def test_bad_timeouts_are_400(setup, value):
    client, _, worker, _ = setup
    response = await client.post("/v1/completions", json=BODY, headers={"x-llmq-timeout-ms": value})
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-llmq-timeout-ms"
    assert worker.produced == []


def saturate(pod, **ages_ms: int) -> None:
    """A fresh batcher report with one request queued per class, each as old as given."""
    classes = {
        key.replace("_paid", ":paid").replace("_free", ":free"): wire.QueueLoad(depth=1, oldest_age_ms=age)
        for key, age in ages_ms.items()
    }
    pod.saturation.reports = [
        wire.BatcherSaturation(
            batcher_id="b", sent_ms=pod.clock.now_ms(), models={"llmq-sim": wire.ModelLoad(classes=classes, workers=1)}
        )
    ]


async def test_overload_sheds_the_lowest_classes_first_with_retry_after(setup):
    client, pod, worker, _ = setup
    saturate(pod, near_interactive=2_600)  # over near_interactive's 2 s: it and deferred are shed
    statuses = {}
    for cls, headers in [
        ("deferred", {"x-llmq-class": "deferred"}),
        ("near", {"x-llmq-class": "near_interactive"}),
        ("free", FREE),
        ("paid", {}),
    ]:
        response = await client.post("/v1/completions", json=BODY, headers=headers)
        statuses[cls] = response.status_code
        if response.status_code == 429:
            assert response.headers["retry-after"] == "3"
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert statuses == {"deferred": 429, "near": 429, "free": 200, "paid": 200}
    assert len(worker.produced) == 2
    text = pod.metrics.render().decode()  # served apart from the API (--metrics-port)
    assert (
        'llmq_api_admission_rejections_total{priority_class="deferred",reason="queue_wait",region="local"} 1.0' in text
    )


async def test_a_model_without_workers_answers_people_503_at_once_and_queues_deferred(setup):
    client, pod, worker, _ = setup
    saturate(pod, interactive_paid=60_000)  # llmq-sim's own backlog: sheds llmq-sim's paid, nothing of llmq-tiny's
    now_ms = pod.clock.now_ms()
    pod.saturation.reports.append(
        wire.BatcherSaturation(
            batcher_id="b2",
            sent_ms=now_ms,
            started_ms=now_ms - 60_000,
            models={
                "llmq-tiny": wire.ModelLoad(
                    classes={"deferred": wire.QueueLoad(depth=3, oldest_age_ms=50_000)}, worker_seen_ms=now_ms - 30_000
                )
            },
        )
    )
    tiny = {**BODY, "model": "llmq-tiny"}
    statuses = {}
    for cls in ("interactive", "near_interactive", "deferred"):
        response = await client.post("/v1/completions", json=tiny, headers={"x-llmq-class": cls})
        statuses[cls] = response.status_code
        if response.status_code == 503:
            assert response.headers["retry-after"] == "2"
            assert response.json()["error"] == {
                **response.json()["error"],
                "code": "model_unavailable",
                "param": "model",
                "type": "server_error",
            }
    assert statuses == {"interactive": 503, "near_interactive": 503, "deferred": 200}
    assert (await client.post("/v1/completions", json=BODY)).status_code == 429
    assert [(r.model, r.traffic_class) for r in worker.produced] == [("llmq-tiny", "deferred")]
    text = pod.metrics.render().decode()  # served apart from the API (--metrics-port)
    assert (
        'llmq_api_admission_rejections_total{priority_class="interactive:paid",reason="model_unavailable",region="local"} 1.0'
        in text
    )


async def test_overloaded_stream_is_a_plain_429_before_any_sse_byte(setup):
    client, pod, worker, _ = setup
    saturate(pod, interactive_paid=19_500)
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    assert response.status_code == 429 and response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "20" and b"data:" not in response.content
    assert worker.produced == []


async def test_pod_in_flight_cap_sheds_by_class(make_app):
    client, pod, worker, _ = await make_app(Settings(api={"max_in_flight": 4}))
    worker.silent = True
    held = [asyncio.create_task(client.post("/v1/completions", json=BODY)) for _ in range(2)]
    while len(pod.registry) < 2:
        await asyncio.sleep(0.01)
    deferred = await client.post("/v1/completions", json=BODY, headers={"x-llmq-class": "deferred"})
    assert deferred.status_code == 429 and deferred.headers["retry-after"] == "1"  # 2 of 4 fills deferred's 0.5
    held.append(asyncio.create_task(client.post("/v1/completions", json=BODY)))  # paid interactive still admitted
    while len(pod.registry) < 3:
        await asyncio.sleep(0.01)
    for request in list(worker.produced):
        pod.registry.dispatch(final(request.request_id))
    assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]


async def test_tenant_rate_limit_is_a_429_naming_the_bucket(make_app):
    keys = KeyStore({})
    keys.add([KeyEntry(tenant="capped", key="k-capped", requests_per_min=1, tokens_per_min=10)])
    client, _, worker, redis = await make_app(keys=keys)
    redis.take_reply = [0, 1200, 1]
    response = await client.post("/v1/completions", json=BODY, headers={"authorization": "Bearer k-capped"})
    assert response.status_code == 429 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["type"] == "requests" and worker.produced == []
    (keys_args,) = redis.takes
    assert keys_args[1][1:] == [1, 60_000, 1, 10, 60_000, 3 + 5]  # one request; prompt + max_tokens tokens


async def test_idempotent_retry_returns_the_stored_result_without_running_again(setup):
    client, _, worker, _ = setup
    idem = {"idempotency-key": "order-1"}
    first = await client.post("/v1/completions", json=BODY, headers=idem)
    (request,) = worker.produced
    assert request.idempotency_key == "order-1"  # its result is in the (fake) result store now
    again = await client.post("/v1/completions", json=BODY, headers=idem)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-request-id"] == first.headers["x-request-id"] == again.json()["id"]
    assert again.json()["choices"] == first.json()["choices"]
    streamed = await client.post("/v1/completions", json=BODY | {"stream": True}, headers=idem)
    assert streamed.status_code == 422  # stream is a parameter too: a different request
    other_tenant = await client.post("/v1/completions", json=BODY, headers=idem | FREE)
    assert other_tenant.status_code == 200 and "idempotent-replayed" not in other_tenant.headers
    assert len(worker.produced) == 2


async def test_a_retry_with_other_parameters_is_a_422_naming_the_request_that_holds_the_key(setup):
    client, _, worker, _ = setup
    idem = {"idempotency-key": "order-5"}
    first = await client.post("/v1/completions", json=BODY, headers=idem)
    other = await client.post("/v1/completions", json=BODY | {"max_tokens": 3}, headers=idem)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.headers["x-request-id"] == first.headers["x-request-id"] and len(worker.produced) == 1


async def test_idempotent_retry_joins_the_request_still_running(setup):
    client, pod, worker, redis = setup
    worker.silent = True
    idem = {"idempotency-key": "order-2"}
    body = BODY | {"stream": True, "stream_options": {"include_usage": True}}
    first = asyncio.create_task(client.post("/v1/completions", json=body, headers=idem))
    while not worker.produced:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(client.post("/v1/completions", json=body, headers=idem))
    async with asyncio.timeout(5):
        while not pod.metrics.registry.get_sample_value("llmq_api_idempotent_replays_total"):  # until it joined
            await asyncio.sleep(0.01)
    (request,) = worker.produced
    result = final(request.request_id, "abcab")
    pod.registry.dispatch(result)  # the first connection's reply
    redis.data[constants.result_key(request.request_id)] = wire.encode(result)  # the result-router's copy
    responses = await asyncio.gather(first, second)
    for response in responses:
        frames = sse_frames(response)
        chunks = [msgspec.json.decode(f) for f in frames[:-1]]
        assert frames[-1] == b"[DONE]" and chunks[-1]["usage"]["completion_tokens"] == 5
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "abcab"
        assert sse_ids(response)[-1] == 5  # a keyed stream's events carry ids: the characters of text they hold
    assert responses[1].headers["x-request-id"] == request.request_id and len(worker.produced) == 1


async def test_a_retry_whose_ended_request_lost_its_stored_result_gets_410_not_a_wait(setup):
    client, _, worker, redis = setup
    idem = {"idempotency-key": "order-4"}
    assert (await client.post("/v1/completions", json=BODY, headers=idem)).status_code == 200
    (request,) = worker.produced
    key = constants.idempotency_key("dev", "order-4")
    claim = msgspec.json.decode(redis.data[key])
    redis.data[key] = msgspec.json.encode(claim | {"deadline_ms": 1})  # it ended long ago ...
    del redis.data[constants.result_key(request.request_id)]  # ... and its result was dropped
    gone = await client.post("/v1/completions", json=BODY, headers=idem)
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "result_evicted"
    assert len(worker.produced) == 1


async def test_retry_after_a_timeout_runs_afresh(setup):
    client, _, worker, redis = setup
    worker.silent = True
    headers = {"idempotency-key": "order-3", "x-llmq-timeout-ms": "50"}
    assert (await client.post("/v1/completions", json=BODY, headers=headers)).status_code == 504
    assert await redis.get(constants.idempotency_key("dev", "order-3")) is None  # released by its owner
    worker.silent = False
    retry = await client.post("/v1/completions", json=BODY, headers=headers)
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers and len(worker.produced) == 2


async def test_stored_results_are_served_to_their_tenant_only(setup):
    client, _, _, redis = setup
    ok = msgspec.structs.replace(final("cmpl-1", "abcab"), tenant_id="dev", created_ms=5_000, finished_ms=6_000)
    failed = wire.FinalResult(
        request_id="cmpl-2",
        outcome=wire.Outcome.EXPIRED,
        model="llmq-sim",
        tenant_id="dev",
        reply_to=wire.HttpReply(instance_id="p"),
    )
    for result in (ok, failed):
        redis.data[constants.result_key(result.request_id)] = wire.encode(result)
    body = (await client.get("/v1/requests/cmpl-1")).json()
    assert (body["status"], body["created"], body["error"]) == ("succeeded", 5, None)
    assert body["response"]["choices"][0]["text"] == "abcab" and body["response"]["id"] == "cmpl-1"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    expired = (await client.get("/v1/requests/cmpl-2")).json()
    assert expired["status"] == "expired" and expired["error"]["code"] == "deadline_exceeded"
    assert (await client.get("/v1/requests/cmpl-1", headers=FREE)).status_code == 404
    assert (await client.get("/v1/requests/cmpl-9")).json()["error"]["code"] == "request_not_found"
    assert (await client.get("/v1/requests/cmpl-1", headers={"authorization": ""})).status_code == 401


async def test_a_keyed_stream_resumed_with_last_event_id_gets_only_the_events_after_it(setup):
    client, pod, worker, redis = setup
    worker.silent = True
    idem = {"idempotency-key": "order-6"}
    body = BODY | {"stream": True}
    first = asyncio.create_task(client.post("/v1/completions", json=body, headers=idem))
    while not worker.produced:
        await asyncio.sleep(0.01)
    (request,) = worker.produced
    log = redis.lists.setdefault(constants.stream_log_key(request.request_id), [])
    for piece in (chunk(request.request_id, "ab", 0, offset=0), chunk(request.request_id, "c", 1, offset=2)):
        piece = msgspec.structs.replace(piece, tenant_id=request.tenant_id)
        log.append(wire.encode(piece))  # the worker logs each chunk before publishing it
        assert pod.registry.dispatch(piece)
    resumed = asyncio.create_task(client.post("/v1/completions", json=body, headers=idem | {"last-event-id": "2"}))
    async with asyncio.timeout(5):
        while not pod.metrics.registry.get_sample_value("llmq_api_stream_resumes_total", {"outcome": "resumed"}):
            await asyncio.sleep(0.01)
    log.append(wire.encode(chunk(request.request_id, "a", 2, offset=3)))
    result = final(request.request_id, "abcab")
    pod.registry.dispatch(result)
    redis.data[constants.result_key(request.request_id)] = wire.encode(result)
    first, resumed = await asyncio.gather(first, resumed)
    texts = [
        "".join(c["choices"][0]["text"] for c in map(msgspec.json.decode, sse_frames(r)[:-1]) if c["choices"])
        for r in (first, resumed)
    ]
    assert texts == ["abcab", "cab"]  # the resumed client had "ab" (id 2): it gets the rest, once
    assert sse_ids(first) == [2, 3, 5] and sse_ids(resumed) == [3, 4, 5]
    assert resumed.headers["x-request-id"] == request.request_id and len(worker.produced) == 1
    assert redis.data[constants.stream_holder_key(request.request_id)].startswith(b"pod-test ")  # it holds it now


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"last-event-id": "3"}, {"stream": True}, 400, "invalid_value"),  # no Idempotency-Key: nothing to resume
        ({"last-event-id": "3", "idempotency-key": "k"}, {}, 400, "invalid_value"),  # not a stream
        ({"last-event-id": "x3", "idempotency-key": "k"}, {"stream": True}, 400, "invalid_value"),
        ({"last-event-id": "3", "idempotency-key": "never-sent"}, {"stream": True}, 404, "stream_not_found"),
    ],
)
async def test_a_bad_resume_is_refused_naming_last_event_id_and_runs_nothing(setup, headers, body, status, code):
    client, _, worker, _ = setup
    response = await client.post("/v1/completions", json=BODY | body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code and response.json()["error"]["param"] == "last-event-id"
    assert worker.produced == []

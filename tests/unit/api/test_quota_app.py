"""The generation path's charge and settlement against an in-process pod (fake worker, in-memory Redis)."""

import pytest

from llmq_api.auth import KeyEntry, KeyStore

CAPPED = {"authorization": "Bearer k-capped"}
BODY = {"model": "llmq-sim", "prompt": "abc", "max_tokens": 5}
ESTIMATE = 3 + 5


@pytest.fixture
async def capped(make_app):
    keys = KeyStore({})
    keys.add([KeyEntry(tenant="capped", key="k-capped", requests_per_min=100, tokens_per_min=1000)])
    return await make_app(keys=keys)


def tokens(calls: list) -> list[int]:
    """The tokens bucket's amount of each recorded take or give."""
    return [args[-1] for _, args in calls]


async def test_a_request_whose_estimate_exceeds_the_bucket_is_a_400_before_anything(capped):
    client, _, worker, redis = capped
    response = await client.post(
        "/v1/completions", headers=CAPPED, json={"model": "llmq-sim", "prompt": "x", "max_tokens": 8000, "n": 100}
    )
    error = response.json()["error"]
    assert response.status_code == 400 and (error["code"], error["param"]) == ("tokens_exceed_limit", "max_tokens")
    assert "800001" in error["message"] and "1000" in error["message"]
    assert worker.produced == [] and redis.takes == []


async def test_a_request_is_charged_its_estimate_once(capped):
    client, pod, worker, redis = capped
    response = await client.post("/v1/completions", headers=CAPPED, json={**BODY, "n": 2})
    await pod.limiter.drain()
    assert response.status_code == 200 and tokens(redis.takes) == [3 + 2 * 5]
    assert response.json()["usage"]["total_tokens"] == 3 + 5 and tokens(redis.gives) == [5]  # one choice generated


async def test_a_deadline_keeps_the_estimate_and_a_failed_produce_gives_it_all_back(capped):
    client, pod, worker, redis = capped
    worker.silent = True
    response = await client.post("/v1/completions", headers={**CAPPED, "x-llmq-timeout-ms": "50"}, json=BODY)
    await pod.limiter.drain()
    assert response.status_code == 504 and tokens(redis.takes) == [ESTIMATE] and redis.gives == []

    async def broken(request):
        raise ConnectionError("broker down")

    worker.produce = broken
    response = await client.post("/v1/completions", headers=CAPPED, json=BODY)
    await pod.limiter.drain()
    assert response.status_code == 503
    assert [args[1:] for _, args in redis.gives] == [[100, 60_000, 1, 1000, 60_000, ESTIMATE]]


async def test_an_idempotent_retry_is_not_charged_twice(capped):
    client, pod, worker, redis = capped
    idem = {**CAPPED, "idempotency-key": "order-7"}
    first, again = [await client.post("/v1/completions", headers=idem, json=BODY) for _ in range(2)]
    await pod.limiter.drain()
    assert first.status_code == again.status_code == 200 and len(worker.produced) == 1
    assert tokens(redis.takes) == [ESTIMATE]


async def test_a_stream_settles_like_a_single_response(capped):
    client, pod, worker, redis = capped
    response = await client.post("/v1/completions", headers=CAPPED, json={**BODY, "n": 3, "stream": True})
    await pod.limiter.drain()
    assert response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
    assert tokens(redis.takes) == [3 + 3 * 5] and tokens(redis.gives) == [2 * 5]  # one choice of 5 generated

"""Admission per model through a real stack (issue 12, item 3): API pod, batcher, one llmq-sim worker and the
result-router on the suite's Kafka and Redis; llmq-tiny is in the catalogue but has no worker.

- llmq-tiny's interactive and near_interactive requests get 503 ``model_unavailable`` + Retry-After at once, a deferred
  one is accepted and its queue depth and age show in the batcher's /metrics (what an autoscaler scaling from zero reads);
- an old llmq-tiny backlog in every class sheds no class of llmq-sim's traffic, for longer than every class's threshold;
- 500 made-up model names (and tenants) produced straight to Kafka do not grow the batcher's or the result-router's
  /metrics beyond a bound, nor the saturation report in Redis.

The shed thresholds are lowered (3 s paid, 2 s free, 1.5 s near_interactive, 1 s deferred instead of 15/5/2/1 s) so that
the backlog outlives all of them within seconds; the rule under test is the same.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from llmq_cli.devstack import DevStack
from llmq_core import constants, kafka, wire
from tests import ports
from tests.stacks import shed_wait_env, sim_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_PORT = ports.block()  # metrics: result-router +10, batcher +11, worker +12
SIM, TINY = "llmq-sim", "llmq-tiny"
PAID, FREE = {"authorization": "Bearer llmq-dev-key"}, {"authorization": "Bearer llmq-dev-free-key"}
SHED_WAIT_MS = {"interactive:paid": 3000, "interactive:free": 2000, "near_interactive": 1500, "deferred": 2000}
TRAFFIC_S = 8.0  # longer than every threshold above, after the backlog is older than all of them
INVENTED = 500
METRICS_GROWTH_BOUND_BYTES = 16_384


@pytest.fixture(scope="module")
def stack(infra):
    with sim_stack(
        infra, (API_PORT,), batch_time_ms=100, sim_max_batch_size=16, extra_env=shed_wait_env(SHED_WAIT_MS)
    ) as running:
        yield running


def metrics_url(stack: DevStack, service: str) -> str:
    offset = {"result-router": 0, "batcher": 1}[service]
    return f"http://127.0.0.1:{stack.cfg.metrics_base_port + offset}/metrics"


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def poll_metric(
    client: httpx.AsyncClient, url: str, name: str, at_least: float, timeout_s: float = 30, **labels: str
) -> float:
    """Scrape ``url`` until the sample reaches ``at_least``; returns its value (fails past ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = sample((await client.get(url)).text, name, **labels)
        if value is not None and value >= at_least:
            return value
        assert time.monotonic() < deadline, f"{name}{labels} = {value}, expected >= {at_least}"
        await asyncio.sleep(0.3)


async def produce_direct(stack: DevStack, requests: list[wire.GenerationRequest]) -> None:
    """Requests straight to Kafka, as an internal producer would (no API admission)."""
    producer = kafka.make_producer(stack.cfg.settings(), linger_ms=20)
    await producer.start()
    try:
        await asyncio.gather(
            *(
                kafka.send_message(producer, constants.requests_topic(r.traffic_class), r, key=r.request_id)
                for r in requests
            )
        )
    finally:
        await producer.stop()


async def reply_topic(stack: DevStack) -> wire.KafkaReply:
    """A Kafka reply topic of this test, created by its owner (the broker may not auto-create topics)."""
    topic = f"admission-test-replies-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.cfg.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    return wire.KafkaReply(topic=topic)


def direct_request(
    model: str, traffic_class: str, tier: str, reply: wire.KafkaReply, ttl_ms: int, tenant: str = "admission-test"
) -> wire.GenerationRequest:
    now_ms = int(time.time() * 1000)
    return wire.GenerationRequest(
        request_id=f"adm-{uuid.uuid4().hex}",
        tenant_id=tenant,
        traffic_class=traffic_class,
        tier=tier,
        model=model,
        prompt="backlog",
        sampling=wire.SamplingParams(max_tokens=4),
        created_ms=now_ms,
        deadline_ms=now_ms + ttl_ms,
        reply_to=reply,
    )


async def complete(
    client: httpx.AsyncClient, model: str, auth: dict, traffic_class: str, prompt: str = "hello"
) -> httpx.Response:
    return await client.post(
        f"http://127.0.0.1:{API_PORT}/v1/completions",
        headers={**auth, "x-llmq-class": traffic_class, "x-llmq-timeout-ms": "30000"},
        json={"model": model, "prompt": prompt, "max_tokens": 4},
    )


async def saturation_reports(stack: DevStack) -> list[wire.BatcherSaturation]:
    redis = Redis.from_url(stack.cfg.redis_url)
    try:
        return [wire.decode(v) for v in (await redis.hgetall(constants.REDIS_SATURATION_KEY)).values()]
    finally:
        await redis.aclose()


async def past_the_heartbeat_timeout_since_the_batcher_started(stack: DevStack) -> None:
    """Until then a model no worker was seen for may still get one: its requests queue (the stack is up sooner)."""
    deadline = time.monotonic() + 30
    while not (fresh := [r for r in await saturation_reports(stack) if r.sent_ms > time.time() * 1000 - 2000]):
        assert time.monotonic() < deadline, "no saturation report from the stack's batcher"
        await asyncio.sleep(0.2)
    wait_s = (
        max(r.started_ms for r in fresh) + stack.cfg.settings().batcher.worker_heartbeat_timeout_ms
    ) / 1000 - time.time()
    await asyncio.sleep(max(wait_s, 0) + 0.2)


async def test_a_model_without_workers_answers_people_503_at_once_and_queues_deferred_work(stack):
    batcher = metrics_url(stack, "batcher")
    await past_the_heartbeat_timeout_since_the_batcher_started(stack)
    async with httpx.AsyncClient(timeout=30) as client:
        for traffic_class in ("interactive", "near_interactive"):
            started = time.monotonic()
            response = await complete(client, TINY, PAID, traffic_class)
            elapsed_s = time.monotonic() - started
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "model_unavailable"
            assert response.json()["error"]["param"] == "model"
            assert int(response.headers["retry-after"]) >= 1
            assert elapsed_s < 2.0, elapsed_s  # at once, not at a deadline
        deferred = asyncio.create_task(complete(client, TINY, PAID, "deferred"))
        try:
            depth = await poll_metric(
                client, batcher, "llmq_batcher_queue_depth", 1, model=TINY, priority_class="deferred"
            )
            age_s = await poll_metric(
                client, batcher, "llmq_batcher_oldest_queued_age_seconds", 0.5, model=TINY, priority_class="deferred"
            )
            assert not deferred.done(), deferred.result().text  # accepted and waiting for a worker, not refused
        finally:
            deferred.cancel()  # the client leaves: its request is cancelled
            await asyncio.gather(deferred, return_exceptions=True)
    print(f"llmq-tiny deferred queue: depth {depth:.0f}, oldest {age_s:.1f} s")


async def sim_traffic(
    client: httpx.AsyncClient, auth: dict, traffic_class: str, until: float, statuses: Counter
) -> None:
    """llmq-sim requests of one class back to back until ``until`` (monotonic seconds)."""
    while time.monotonic() < until:
        response = await complete(client, SIM, auth, traffic_class)
        statuses[(traffic_class, "free" if auth is FREE else "paid", response.status_code)] += 1
        if response.status_code != 200:
            print(f"llmq-sim {traffic_class}: {response.status_code} {response.text[:300]}")
            await asyncio.sleep(0.1)


async def test_a_backlog_of_one_model_sheds_no_class_of_another(stack):
    reply = await reply_topic(stack)
    backlog = [
        direct_request(TINY, cls, tier, reply, ttl_ms=60_000)
        for cls, tier in [
            ("interactive", "paid"),
            ("interactive", "free"),
            ("near_interactive", "paid"),
            ("deferred", "paid"),
        ]
        for _ in range(5)
    ]
    await produce_direct(stack, backlog)
    batcher = metrics_url(stack, "batcher")
    statuses: Counter = Counter()
    async with httpx.AsyncClient(timeout=30) as client:
        for priority_class in SHED_WAIT_MS:  # every class of the backlog is queued, older than the largest threshold
            await poll_metric(
                client,
                batcher,
                "llmq_batcher_oldest_queued_age_seconds",
                max(SHED_WAIT_MS.values()) / 1000 + 0.5,
                model=TINY,
                priority_class=priority_class,
            )
        until = time.monotonic() + TRAFFIC_S
        await asyncio.gather(
            *(
                sim_traffic(client, auth, cls, until, statuses)
                for auth, cls in [
                    (PAID, "interactive"),
                    (FREE, "interactive"),
                    (PAID, "near_interactive"),
                    (PAID, "deferred"),
                ]
            )
        )
        oldest_s = sample(
            (await client.get(batcher)).text,
            "llmq_batcher_oldest_queued_age_seconds",
            model=TINY,
            priority_class="interactive:paid",
        )
    print(f"llmq-sim statuses over {TRAFFIC_S:.0f} s beside a {oldest_s:.1f} s old llmq-tiny backlog: {dict(statuses)}")
    # still queued all along; the gauge is the batcher's once-a-second sample, so up to that interval behind
    assert oldest_s > max(SHED_WAIT_MS.values()) / 1000 + TRAFFIC_S - constants.SATURATION_REPORT_INTERVAL_MS / 1000
    assert {status for (_, _, status) in statuses} == {200}, statuses
    assert {(cls, tier) for (cls, tier, _) in statuses} == {
        ("interactive", "paid"),
        ("interactive", "free"),
        ("near_interactive", "paid"),
        ("deferred", "paid"),
    }


async def test_made_up_model_names_from_kafka_do_not_grow_metrics(stack):
    router, batcher = metrics_url(stack, "result-router"), metrics_url(stack, "batcher")
    reply = await reply_topic(stack)
    async with httpx.AsyncClient(timeout=30) as client:
        before = {url: len((await client.get(url)).content) for url in (router, batcher)}
        errored_before = (
            sample((await client.get(router)).text, "llmq_results_total", model="other", outcome="client_error") or 0
        )
        await produce_direct(
            stack,
            [
                direct_request(f"made-up-{i}", "interactive", "paid", reply, ttl_ms=1500, tenant=f"made-up-tenant-{i}")
                for i in range(INVENTED)
            ],
        )
        # Refused where they enter (model_not_found, llmq_core.requests): each ends errored for a client error,
        # counted as "other".
        await poll_metric(
            client,
            router,
            "llmq_results_total",
            errored_before + INVENTED,
            timeout_s=45,
            model="other",
            outcome="client_error",
        )
        texts = {url: (await client.get(url)).text for url in (router, batcher)}
    reports = await saturation_reports(stack)
    growth = {url: len(texts[url].encode()) - before[url] for url in texts}
    print(f"/metrics growth after {INVENTED} made-up models: {growth}")
    assert all("made-up" not in text for text in texts.values())
    assert all(g < METRICS_GROWTH_BOUND_BYTES for g in growth.values()), growth
    assert all(not any(m.startswith("made-up") for m in r.models) for r in reports)

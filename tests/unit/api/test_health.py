"""health.py: the Kafka circuit breaker (table-driven on a fake clock), dependency states, and the readiness and
dependency reports."""

import pytest

from llmq_api.health import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, Dependency, dependencies_report, report
from llmq_core.clock import FakeClock

T0 = 1_700_000_000_000


def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(
        Dependency("kafka", clock), clock, backoff_ms=1000, max_backoff_ms=3000, probe_timeout_ms=2000
    )


# Each step: (ms to advance, event, expected allow() result or None, state after, retry_after_ms after).
# Events: "allow" calls allow(); "ok" / "fail" report a produce.
STEPS = {
    "closed passes and stays closed on success": [
        (0, "allow", True, CLOSED, 0),
        (0, "ok", None, CLOSED, 0),
        (5000, "allow", True, CLOSED, 0),
    ],
    "a failure opens: refused at once until the backoff has passed": [
        (0, "fail", None, OPEN, 1000),
        (0, "allow", False, OPEN, 1000),
        (400, "allow", False, OPEN, 600),
        (599, "allow", False, OPEN, 1),
    ],
    "past the backoff one request probes, the others are still refused": [
        (0, "fail", None, OPEN, 1000),
        (1000, "allow", True, HALF_OPEN, 2000),
        (10, "allow", False, HALF_OPEN, 1990),
    ],
    "a successful probe closes": [
        (0, "fail", None, OPEN, 1000),
        (1000, "allow", True, HALF_OPEN, 2000),
        (0, "ok", None, CLOSED, 0),
        (0, "allow", True, CLOSED, 0),
    ],
    "a failed probe reopens for twice the backoff, capped": [
        (0, "fail", None, OPEN, 1000),
        (1000, "allow", True, HALF_OPEN, 2000),
        (0, "fail", None, OPEN, 2000),
        (2000, "allow", True, HALF_OPEN, 2000),
        (0, "fail", None, OPEN, 3000),
        (3000, "allow", True, HALF_OPEN, 2000),
        (0, "fail", None, OPEN, 3000),
    ],
    "after closing, the next outage starts from the first backoff again": [
        (0, "fail", None, OPEN, 1000),
        (1000, "allow", True, HALF_OPEN, 2000),
        (0, "fail", None, OPEN, 2000),
        (2000, "allow", True, HALF_OPEN, 2000),
        (0, "ok", None, CLOSED, 0),
        (0, "fail", None, OPEN, 1000),
    ],
    "stragglers failing while open do not extend the backoff": [
        (0, "fail", None, OPEN, 1000),
        (500, "fail", None, OPEN, 500),
        (500, "allow", True, HALF_OPEN, 2000),
    ],
    "a probe that never reports is replaced after the probe timeout": [
        (0, "fail", None, OPEN, 1000),
        (1000, "allow", True, HALF_OPEN, 2000),
        (1999, "allow", False, HALF_OPEN, 1),
        (1, "allow", True, HALF_OPEN, 2000),
    ],
    "an acknowledged produce closes it whatever the state (the producer recovered)": [
        (0, "fail", None, OPEN, 1000),
        (100, "ok", None, CLOSED, 0),
        (0, "allow", True, CLOSED, 0),
    ],
}


@pytest.mark.parametrize("steps", STEPS.values(), ids=STEPS.keys())
def test_breaker_steps(steps):
    clock = FakeClock(T0)
    cb = breaker(clock)
    for i, (advance_ms, event, allowed, state, retry_after_ms) in enumerate(steps):
        clock.advance(advance_ms)
        if event == "allow":
            assert cb.allow() is allowed, f"step {i}"
        else:
            cb.succeeded() if event == "ok" else cb.failed("broker down")
        assert (cb.state, cb.retry_after_ms()) == (state, retry_after_ms), f"step {i}"


def test_a_failure_of_an_attempt_older_than_the_last_success_keeps_the_breaker_closed():
    clock = FakeClock(0)
    breaker = CircuitBreaker(
        Dependency("kafka", clock), clock, backoff_ms=1000, max_backoff_ms=4000, probe_timeout_ms=2000
    )
    started_in_outage = clock.now_ms()
    clock.advance(500)
    breaker.succeeded()  # the broker is back: a later produce went through
    clock.advance(1500)
    breaker.failed("timed out", started_in_outage)  # the outage's produce times out only now
    assert breaker.state == CLOSED and breaker.allow()
    breaker.failed("timed out", clock.now_ms())  # a fresh failure still opens it
    assert breaker.state == OPEN


def test_the_dependency_follows_the_breaker_with_since_and_reason():
    clock = FakeClock(T0)
    cb = breaker(clock)
    kafka = cb.dependency
    assert (kafka.state, kafka.since_ms, kafka.ever_up) == ("starting", T0, False)
    clock.advance(10)
    cb.succeeded()
    assert (kafka.state, kafka.since_ms, kafka.reason, kafka.ever_up) == ("up", T0 + 10, None, True)
    clock.advance(10)
    cb.failed("producing a request took longer than 2 s")
    clock.advance(10)
    cb.failed("still down")  # the state holds since the first failure; the reason is the latest
    assert (kafka.state, kafka.since_ms, kafka.reason) == ("down", T0 + 20, "still down")
    clock.advance(2000)
    assert cb.allow()
    cb.succeeded()
    assert kafka.describe() == {
        "state": "up",
        "since": "2023-11-14T22:13:22.030Z",
        "since_ms": T0 + 2030,
        "reason": None,
    }


def dependency(clock: FakeClock, name: str, *history: bool) -> Dependency:
    dep = Dependency(name, clock)
    for up in history:
        dep.mark(up, None if up else f"{name} unreachable")
    return dep


@pytest.mark.parametrize(
    "kafka, redis, draining, ready, status, failing",
    [
        ((), (), False, False, "starting", ["kafka", "redis"]),
        ((False,), (True,), False, False, "starting", ["kafka"]),  # never reached Kafka: not taken into the Service
        ((True,), (True,), False, True, "ok", []),
        ((True, False), (True,), False, True, "degraded", ["kafka"]),  # lost later: still ready, on purpose
        ((True,), (True, False), False, True, "degraded", ["redis"]),
        ((True, False, True), (True,), False, True, "ok", []),
        ((True,), (True,), True, False, "draining", []),
    ],
)
def test_readiness(kafka, redis, draining, ready, status, failing):
    clock = FakeClock(T0)
    deps = [dependency(clock, "kafka", *kafka), dependency(clock, "redis", *redis)]
    assert report(deps, draining) == (ready, {"ready": ready, "status": status, "failing": failing})


def test_dependencies_report_names_each_with_its_state():
    clock = FakeClock(T0)
    healthy, body = dependencies_report([dependency(clock, "kafka", True, False), dependency(clock, "redis", True)])
    assert not healthy and body["status"] == "degraded"
    assert body["dependencies"]["kafka"]["state"] == "down" and body["dependencies"]["kafka"]["reason"]
    assert body["dependencies"]["redis"] == {
        "state": "up",
        "since": "2023-11-14T22:13:20.000Z",
        "since_ms": T0,
        "reason": None,
    }
    assert dependencies_report([dependency(clock, "kafka", True)])[0]


async def test_the_pod_reports_its_dependencies_and_refuses_at_once_while_kafka_fails(setup):
    client, pod, worker, _ = setup
    assert (await client.get("/dependencies")).json()["status"] == "ok"
    pod.breaker.failed("producing a request took longer than 2 s")
    response = await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a"})
    assert (response.status_code, response.json()["error"]["code"]) == (503, "kafka_unavailable")
    assert response.headers["retry-after"] == "1" and response.headers["x-should-retry"] == "true"
    assert worker.produced == []
    readyz = await client.get("/readyz")
    assert readyz.status_code == 200 and (readyz.json()["status"], readyz.json()["failing"]) == ("degraded", ["kafka"])
    deps = await client.get("/dependencies")
    assert deps.status_code == 503 and deps.json()["status"] == "degraded"
    kafka = deps.json()["dependencies"]["kafka"]
    assert kafka["state"] == "down" and kafka["reason"] == "producing a request took longer than 2 s"
    assert deps.json()["dependencies"]["redis"]["state"] == "up"
    metrics = pod.metrics.render().decode()  # served apart from the API (--metrics-port)
    assert 'llmq_api_dependency_up{dependency="kafka",region="local"} 0.0' in metrics
    assert 'llmq_api_dependency_up{dependency="redis",region="local"} 1.0' in metrics

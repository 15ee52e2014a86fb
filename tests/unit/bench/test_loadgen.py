"""The load generator's pure parts (schedule, plan, summary) and its open-loop HTTP driver against a real local server."""

from __future__ import annotations

import asyncio
import json
import random
import statistics

import pytest
from aiohttp import web

from llmq_bench import loadgen
from llmq_bench.loadgen import OK, Planned, Sample
from llmq_bench.prompts import CodePrompt
from llmq_core.settings import ApiSettings
from tests.unit.bench.local_http import refused_url, serve

PROMPTS = [CodePrompt(id=f"p{i}", prompt=f"def f{i}():", max_tokens=16 + i) for i in range(3)]


def plan(
    at_s: float = 0.0,
    traffic_class: str = "interactive",
    key: str = "k",
    stream: bool = False,
    base_url: str = "http://pod-a/v1",
) -> Planned:
    return Planned(
        at_s=at_s,
        prompt="abc",
        max_tokens=4,
        traffic_class=traffic_class,
        api_key=key,
        stream=stream,
        base_url=base_url,
    )


def sample(
    status: str = OK, e2e_ms: float = 100.0, end_s: float = 1.0, ttft_ms: float | None = None, **plan_kwargs
) -> Sample:
    return Sample(planned=plan(**plan_kwargs), status=status, e2e_ms=e2e_ms, end_s=end_s, ttft_ms=ttft_ms)


# --- schedule and plan ---------------------------------------------------------------------------------------------


def test_parse_weights():
    assert loadgen.parse_weights("a=0.8, b=0.2") == {"a": 0.8, "b": 0.2}
    assert loadgen.parse_weights("interactive") == {"interactive": 1.0}
    for bad in ("", "a=-1", "a=0,b=0"):
        with pytest.raises(ValueError):
            loadgen.parse_weights(bad)


def test_poisson_arrivals_have_the_rate_and_exponential_gaps():
    arrivals = loadgen.poisson_arrivals(50.0, count=10**6, duration_s=400.0, rng=random.Random(1))
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert arrivals == sorted(arrivals) and 0 < arrivals[0] and arrivals[-1] < 400.0
    assert len(arrivals) / 400.0 == pytest.approx(50.0, rel=0.02)
    # Exponential gaps: standard deviation equals the mean (a fixed-interval schedule would have none).
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.03)


def test_poisson_arrivals_stop_at_the_count_or_the_duration():
    assert len(loadgen.poisson_arrivals(1000.0, count=25, duration_s=60.0, rng=random.Random(0))) == 25
    short = loadgen.poisson_arrivals(10.0, count=10**6, duration_s=2.0, rng=random.Random(0))
    assert 5 < len(short) < 40 and short[-1] < 2.0
    with pytest.raises(ValueError):
        loadgen.poisson_arrivals(0.0, count=1, duration_s=1.0, rng=random.Random(0))


def test_arrival_window_is_the_duration_unless_the_count_ended_arrivals():
    assert loadgen.arrival_window_s([0.1, 0.5, 0.9], count=10, duration_s=5.0) == 5.0
    assert loadgen.arrival_window_s([0.1, 0.5, 0.9], count=3, duration_s=5.0) == 0.9
    assert loadgen.arrival_window_s([], count=0, duration_s=5.0) == 5.0


def test_plan_cycles_prompts_and_pods_and_draws_the_mix():
    arrivals = [i / 100 for i in range(3000)]
    plans = loadgen.plan_requests(
        PROMPTS,
        arrivals,
        classes={"interactive": 3, "deferred": 1},
        keys={"paid": 1, "free": 1},
        stream_share=0.25,
        base_urls=["u0", "u1"],
        rng=random.Random(3),
    )
    assert [p.at_s for p in plans] == arrivals
    assert [p.max_tokens for p in plans[:4]] == [16, 17, 18, 16]
    assert [p.base_url for p in plans[:3]] == ["u0", "u1", "u0"]
    share = lambda pred: sum(map(pred, plans)) / len(plans)  # noqa: E731
    assert share(lambda p: p.traffic_class == "interactive") == pytest.approx(0.75, abs=0.03)
    assert share(lambda p: p.api_key == "free") == pytest.approx(0.5, abs=0.03)
    assert share(lambda p: p.stream) == pytest.approx(0.25, abs=0.03)


# --- summary -------------------------------------------------------------------------------------------------------


def test_percentile_by_nearest_rank():
    assert [loadgen.percentile([3, 1, 2, 4], q) for q in (25, 50, 75, 99, 100)] == [1, 2, 3, 4, 4]
    assert loadgen.percentile([7.0], 99) == 7.0 and loadgen.percentile([], 50) == 0.0


def test_quantiles_by_nearest_rank():
    q = loadgen.quantiles_ms(list(range(1, 101)))
    assert (q["p50"], q["p90"], q["p95"], q["p99"], q["mean"]) == (50, 90, 95, 99, 50.5)
    assert loadgen.quantiles_ms([]) == {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}


def test_summary_goodput_counts_only_successes_within_the_slo():
    samples = [
        sample(e2e_ms=100, end_s=9.0),
        sample(e2e_ms=400, end_s=10.0),
        sample(status="429", e2e_ms=5),
        sample(status="504", e2e_ms=3000),
        sample(status=loadgen.TIMEOUT, e2e_ms=6000),
    ]
    report = loadgen.summarize(samples, window_s=2.0, slo_ms=300)
    assert (report["requests"], report["succeeded"], report["good"]) == (5, 2, 1)
    assert report["offered_rps"] == 2.5 and report["goodput_rps"] == 0.5 and report["goodput_ratio"] == 0.2
    assert report["throughput_rps"] == pytest.approx(2 / 10.0)
    assert (report["rejected_429"], report["timeouts_504"]) == (1, 1)
    assert report["status"] == {"ok": 2, "429": 1, "504": 1, "timeout": 1}
    assert report["latency_ms"]["p99"] == 400  # failures do not enter the latency quantiles
    assert report["batches"] is None


def test_summary_splits_by_class_and_tenant_with_ttft_from_streams():
    samples = [
        sample(traffic_class="interactive", key="paid", stream=True, e2e_ms=200, ttft_ms=50),
        sample(traffic_class="interactive", key="free", e2e_ms=300),
        sample(traffic_class="deferred", key="paid", status="429"),
    ]
    report = loadgen.summarize(samples, window_s=1.0, slo_ms=1000)
    assert set(report["classes"]) == {"interactive", "deferred"}
    interactive = report["classes"]["interactive"]
    assert (interactive["requests"], interactive["good"]) == (2, 2)
    assert interactive["ttft_ms"]["p50"] == 50 and interactive["latency_ms"]["p99"] == 300
    assert report["classes"]["deferred"]["rejected_429"] == 1
    assert report["tenants"]["paid"]["requests"] == 2 and report["tenants"]["free"]["succeeded"] == 1


def test_summary_batch_size_and_fill_from_counter_deltas():
    report = loadgen.summarize([sample()], window_s=1.0, slo_ms=1000, batch_delta=(4, 96), max_batch_size=32)
    assert report["batches"] == {"batches": 4, "requests": 96, "mean_size": 24.0, "max_batch_size": 32, "fill": 0.75}
    empty = loadgen.summarize([], window_s=1.0, slo_ms=1000, batch_delta=(0, 0))
    assert empty["batches"]["fill"] == 0.0 and empty["goodput_ratio"] == 0.0


def test_stream_error_events_map_to_http_statuses():
    assert loadgen.stream_error_status({"code": "deadline_exceeded", "type": "timeout_error"}) == "504"
    assert loadgen.stream_error_status({"code": None, "type": "overloaded"}) == "429"
    assert loadgen.stream_error_status({"code": "request_canceled", "type": "x"}) == "stream_request_canceled"


# --- HTTP driver ---------------------------------------------------------------------------------------------------


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


async def test_requests_are_launched_on_schedule_not_after_earlier_answers():
    """The server answers nobody until every request has arrived: a closed loop would never finish."""
    count = 20
    arrived = 0
    all_here = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived == count:
            all_here.set()
        await all_here.wait()
        return web.json_response({"choices": [{"text": "x"}]})

    done: list[Sample] = []
    async with serve(handler) as pod_0, serve(handler) as pod_1:
        plans = [plan(at_s=i * 0.001, base_url=f"{(pod_0, pod_1)[i % 2]}/v1") for i in range(count)]
        samples = await asyncio.wait_for(loadgen.run_load(plans, model="llmq-sim", on_done=done.append), 10)
    assert [s.status for s in samples] == [OK] * count and len(done) == count
    assert [s.planned for s in samples] == plans


async def test_request_shape_statuses_and_stream_ttft():
    seen: list[tuple[str, str, dict, bytes]] = []

    async def handler(request: web.Request) -> web.Response:
        content = await request.read()
        seen.append((request.method, request.path, dict(request.headers), content))
        body = json.loads(content)
        if body["prompt"] == "busy":
            return web.json_response({"error": {"type": "rate_limit_error"}}, status=429)
        if body["prompt"] == "broken":
            return web.json_response({"error": {"code": "engine_error", "message": "it broke"}}, status=500)
        if body["stream"]:
            events = [{"choices": [{"text": ""}]}, {"choices": [{"text": "ab"}]}]
            if body["prompt"] == "late":
                events.append({"error": {"code": "deadline_exceeded", "type": "timeout_error"}})
            if body["prompt"] == "lost":
                events.append({"error": {"code": "stream_interrupted", "type": "server_error", "message": "lost"}})
            text = sse(*events)
            return web.Response(
                body=text if body["prompt"] != "cut" else text[: text.index(b"data: [DONE]")],
                content_type="text/event-stream",
            )
        return web.json_response({"choices": [{"text": "abca"}]})

    async with serve(handler) as pod:
        base = dict(max_tokens=4, traffic_class="near_interactive", api_key="llmq-dev-free-key", base_url=f"{pod}/v1")
        plans = [
            Planned(at_s=0, prompt="abc", stream=False, **base),
            Planned(at_s=0, prompt="abc", stream=True, **base),
            Planned(at_s=0, prompt="busy", stream=False, **base),
            Planned(at_s=0, prompt="late", stream=True, **base),
            Planned(at_s=0, prompt="cut", stream=True, **base),
            Planned(at_s=0, prompt="lost", stream=True, **base),
            Planned(at_s=0, prompt="broken", stream=False, **base),
        ]
        samples = await loadgen.run_load(plans, model="llmq-sim", server_timeout_ms=1500)
    assert [s.status for s in samples] == [OK, OK, "429", "504", loadgen.ERROR, "stream_stream_interrupted", "500"]
    # every failure says what it was (the report's errors), an error event in a stream as an error answer
    assert [s.detail for s in samples] == [
        "", "", "429 rate_limit_error", "504 deadline_exceeded", "the stream ended without [DONE]",
        "stream_stream_interrupted stream_interrupted", "500 engine_error",
    ]  # fmt: skip
    assert samples[0].ttft_ms is None and samples[1].ttft_ms is not None and samples[1].ttft_ms <= samples[1].e2e_ms
    # the first plan's request (they arrive concurrently, in any order)
    method, path, headers, content = next(r for r in seen if json.loads(r[3])["stream"] is False and b"abc" in r[3])
    assert (method, path) == ("POST", "/v1/completions")
    assert headers["Authorization"] == "Bearer llmq-dev-free-key" and headers["Content-Type"] == "application/json"
    assert headers["x-llmq-class"] == "near_interactive" and headers["x-llmq-timeout-ms"] == "1500"
    assert json.loads(content) == {
        "model": "llmq-sim",
        "prompt": "abc",
        "max_tokens": 4,
        "temperature": 0,
        "stream": False,
    }


async def test_a_server_that_stalls_is_a_client_timeout_streaming_or_not():
    """A real client timeout (0.2 s): the server stalls before answering, or after a stream's first event."""
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if not (await request.json())["stream"]:
            await release.wait()
            return web.json_response({})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        await release.wait()
        return response

    async with serve(handler) as pod:
        try:
            plans = [plan(base_url=f"{pod}/v1"), plan(stream=True, base_url=f"{pod}/v1")]
            samples = await loadgen.run_load(plans, model="llmq-sim", timeout_s=0.2)
        finally:
            release.set()
    assert [s.status for s in samples] == [loadgen.TIMEOUT, loadgen.TIMEOUT]
    assert all(s.detail and s.ttft_ms is None for s in samples)


async def test_an_idle_connection_is_not_reused_past_the_keep_alive(monkeypatch):
    """Reusing a connection the server is closing fails the request written on it (ServerDisconnectedError): the
    session drops idle connections itself, well before the API pods' keep-alive timeout closes them."""
    assert loadgen.KEEPALIVE_S * 1000 <= ApiSettings().keep_alive_timeout_ms / 5
    monkeypatch.setattr(loadgen, "KEEPALIVE_S", 0.05)
    peers: list[tuple[str, int]] = []

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({})

    async with serve(handler) as pod, loadgen.client_session(1, 5) as session:
        for _ in range(2):
            async with session.post(f"{pod}/v1/completions") as response:
                await response.read()
            await asyncio.sleep(0.1)  # idle twice the keep-alive
    assert len(set(peers)) == 2


async def test_unreachable_server_is_an_error_sample_not_a_crash():
    url = f"{refused_url()}/v1"
    samples = await loadgen.run_load([plan(base_url=url), plan(stream=True, base_url=url)], model="llmq-sim")
    assert [s.status for s in samples] == [loadgen.ERROR, loadgen.ERROR]
    [(detail, count)] = loadgen.summarize(samples, window_s=1, slo_ms=1)["errors"].items()
    assert detail.startswith("ClientConnectorError: Cannot connect") and count == 2


async def test_an_http_error_counts_by_its_status_and_error_code():
    async def handler(request: web.Request) -> web.Response:
        if request.headers["authorization"].endswith("plain"):
            return web.Response(status=503, text="upstream gone")
        error = {"error": {"message": "m", "type": "server_error", "code": "worker_unavailable"}}
        return web.json_response(error, status=503)

    async with serve(handler) as pod:
        plans = [plan(base_url=f"{pod}/v1"), plan(base_url=f"{pod}/v1"), plan(key="plain", base_url=f"{pod}/v1")]
        samples = await loadgen.run_load(plans, model="llmq-sim")
    assert [s.status for s in samples] == ["503"] * 3
    assert loadgen.summarize(samples, window_s=1, slo_ms=1)["errors"] == {"503 worker_unavailable": 2, "503": 1}


async def test_wait_ready_polls_until_every_pod_is_ready():
    calls: list[tuple[str, str]] = []

    def pod(name: str):
        async def handler(request: web.Request) -> web.Response:
            calls.append((name, request.path))
            return web.json_response({}, status=503 if len(calls) < 3 else 200)

        return handler

    async with serve(pod("a")) as a, serve(pod("b")) as b:
        await loadgen.wait_ready([f"{a}/v1", f"{b}/v1"], 5, poll_s=0.001)
    assert calls == [("a", "/readyz")] * 3 + [("b", "/readyz")]

    async def never(request: web.Request) -> web.Response:
        return web.json_response({}, status=503)

    async with serve(never) as down:
        with pytest.raises(TimeoutError):
            await loadgen.wait_ready([f"{down}/v1"], 0.05, poll_s=0.001)

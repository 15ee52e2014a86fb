"""Shutdown: SIGTERM drains at once and closes the listener after the shutdown delay; a request still waiting when the
pod's drain runs out (uvicorn cancels it) gets a 503 + Retry-After, not a 500; the delay and the drain leave time to
close the clients within the grace."""

import asyncio
import json
import signal
from types import SimpleNamespace

import uvicorn

from llmq_api.main import CLOSE_BUDGET_S, DrainingServer, requests_grace_s
from llmq_api.metrics import ApiMetrics
from llmq_api.responses import PendingRequest, ResultResponse, StreamResponse
from llmq_api.waiters import Abandoned, WaiterRegistry
from llmq_core import wire
from llmq_core.clock import FakeClock
from tests.unit.api.fakes import CancelRecorder

NOW_MS = 1_700_000_000_000


def pending(stream: bool) -> tuple[PendingRequest, CancelRecorder]:
    registry, cancels = WaiterRegistry(10), CancelRecorder()
    request = wire.GenerationRequest(
        request_id="r1",
        model="llmq-sim",
        prompt="hi",
        stream=stream,
        created_ms=NOW_MS,
        deadline_ms=NOW_MS + 60_000,
        reply_to=wire.HttpReply(instance_id="pod"),
    )
    waiter = registry.register("r1", stream=stream)
    return PendingRequest(
        request=request,
        waiter=waiter,
        include_usage=False,
        registry=registry,
        publish_cancel=cancels,
        metrics=ApiMetrics(lambda: len(registry)),
        clock=FakeClock(NOW_MS),
    ), cancels


async def serve_until_cancelled(response) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message)

    task = asyncio.create_task(response({"type": "http"}, receive, send))
    await asyncio.sleep(0.01)
    task.cancel()  # what uvicorn does once timeout_graceful_shutdown is over
    await asyncio.gather(task, return_exceptions=True)
    return sent


async def test_a_held_request_is_handed_back_with_503_and_its_work_cancelled():
    held, cancels = pending(stream=False)
    sent = await serve_until_cancelled(ResultResponse(held))
    start, body = sent
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body["body"])["error"]["code"] == "shutting_down"
    assert held.waiter.resolution == Abandoned("pod_shutdown")
    assert cancels.cancels == [("r1", "pod_shutdown")]


async def test_a_held_stream_ends_with_a_retryable_error_event():
    held, cancels = pending(stream=True)
    sent = await serve_until_cancelled(StreamResponse(held))
    events = b"".join(m.get("body", b"") for m in sent)
    assert b'"code":"shutting_down"' in events and events.endswith(b"data: [DONE]\n\n")
    assert sent[-1]["more_body"] is False
    assert cancels.cancels == [("r1", "pod_shutdown")]


def test_requests_drain_and_closing_the_clients_fit_in_the_grace():
    for grace_s in (5, 8, 10, 30):
        assert 1 <= requests_grace_s(grace_s) <= 0.8 * grace_s
        assert requests_grace_s(grace_s) + CLOSE_BUDGET_S <= grace_s


def test_requests_grace_leaves_room_for_the_shutdown_delay():
    for grace_s, delay_s in ((8, 2), (10, 2), (30, 5)):
        assert 1 <= requests_grace_s(grace_s, delay_s) <= requests_grace_s(grace_s) - delay_s
        assert delay_s + requests_grace_s(grace_s, delay_s) + CLOSE_BUDGET_S <= grace_s


def draining_server(delay_ms: int) -> tuple[DrainingServer, SimpleNamespace, FakeClock]:
    pod, clock = SimpleNamespace(draining=False), FakeClock()
    return DrainingServer(uvicorn.Config(app=None), pod, delay_ms, clock), pod, clock  # type: ignore[arg-type]


async def test_sigterm_drains_at_once_and_closes_the_listener_after_the_delay():
    server, pod, clock = draining_server(2000)
    assert not await server.on_tick(1)
    server.handle_exit(signal.SIGTERM, None)
    assert pod.draining and not await server.on_tick(2)  # readiness 503 while the listener still accepts
    clock.advance(1999)
    server.handle_exit(signal.SIGTERM, None)  # a repeated SIGTERM does not move the close
    assert not await server.on_tick(3)
    clock.advance(1)
    assert await server.on_tick(4)


async def test_no_delay_closes_at_once_and_a_second_sigint_does_not_wait():
    server, pod, _ = draining_server(0)
    server.handle_exit(signal.SIGTERM, None)
    assert pod.draining and await server.on_tick(1)
    server, _, _ = draining_server(60_000)
    server.handle_exit(signal.SIGINT, None)
    assert not await server.on_tick(1)
    server.handle_exit(signal.SIGINT, None)
    assert await server.on_tick(2)

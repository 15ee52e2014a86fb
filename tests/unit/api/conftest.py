"""The in-process app's fixture: a Pod with a fake worker as its producer and an in-memory Redis."""

import asyncio

import httpx
import msgspec
import pytest

from llmq_api.app import create_app
from llmq_api.auth import KeyStore
from llmq_api.pod import Pod
from llmq_core import constants, wire
from llmq_core.settings import Settings
from tests.fake_results import fake_result
from tests.fakes import FakeRedis

DEV_AUTH = {"authorization": "Bearer llmq-dev-key"}


class FakeWorker:
    """Produces into nothing; answers like llmq-sim (replays the prompt) unless told to stay silent or fail, and stores
    the result as the result-router would."""

    ready = True

    def __init__(self) -> None:
        self.pod: Pod | None = None
        self.produced: list[wire.GenerationRequest] = []
        self.silent = False
        self.error: wire.ErrorInfo | None = None
        self.outcome: wire.Outcome | None = None  # set: every result's outcome (else succeeded, or errored)
        self.choice: wire.Choice | None = None  # set: the one choice of every result (e.g. one a stop string ended)
        self.timings: wire.Timings | None = None  # set: every result's timings

    async def run(self) -> None: ...

    async def stop(self) -> None: ...

    async def produce(self, request: wire.GenerationRequest) -> None:
        self.produced.append(request)
        if not self.silent:
            asyncio.get_running_loop().call_soon(self._answer, request)

    def _answer(self, request: wire.GenerationRequest) -> None:
        source = request.prompt if request.prompt is not None else request.messages[-1].content
        text = (source * request.sampling.max_tokens)[: request.sampling.max_tokens]
        if request.stream:
            for seq, start in enumerate(range(0, len(text), 2)):
                self.pod.registry.dispatch(
                    wire.TokenChunk(
                        request_id=request.request_id,
                        text=text[start : start + 2],
                        seq=seq,
                        sent_ms=0,
                        tenant_id=request.tenant_id,
                    )
                )
        outcome = self.outcome or (wire.Outcome.ERRORED if self.error else wire.Outcome.SUCCEEDED)
        result = fake_result(request, outcome, text, error=self.error)
        if self.choice is not None:
            result = msgspec.structs.replace(result, choices=[self.choice])
        if self.timings is not None:
            result = msgspec.structs.replace(result, timings=self.timings)
        self.pod.registry.dispatch(result)
        self.pod.redis.data[constants.result_key(request.request_id)] = wire.encode(result)  # the result-router


@pytest.fixture
async def make_app():
    """make_app(settings=None, keys=None) -> (client, pod, worker, redis); the client sends llmq-dev-key."""
    clients, pods = [], []

    async def make(settings: Settings | None = None, keys: KeyStore | None = None):
        worker, redis = FakeWorker(), FakeRedis()
        pod = Pod(
            settings or Settings(api={"max_body_bytes": 2000}), "pod-test", producer=worker, redis=redis, keys=keys
        )
        worker.pod = pod
        pods.append(pod)
        pod.listener.subscribed = True  # stands in for the Redis subscription, which these tests never open
        pod.breaker.succeeded()  # and for the Kafka producer's start
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(pod)), base_url="http://api", headers=DEV_AUTH
        )
        clients.append(client)
        return client, pod, worker, redis

    yield make
    for client in clients:
        await client.aclose()
    for pod in pods:  # the one background task these pods start: the cancels' sender (pod.start is never called)
        await pod.cancels.stop(1.0)


async def published(redis: FakeRedis, count: int = 1) -> list[tuple[str, bytes]]:
    """What ``redis`` got published once it holds ``count`` messages (a pod's Cancels go out from a task of its own,
    a few loop turns after the response)."""
    for _ in range(1000):
        if len(redis.published) >= count:
            return redis.published
        await asyncio.sleep(0)
    raise AssertionError(f"{len(redis.published)} messages published, not {count}")


@pytest.fixture
async def setup(make_app):
    return await make_app()


@pytest.fixture
async def unexpected_error(setup) -> httpx.Response:
    """A completion's response from a pod whose code raises a bug (the app's own error handling, not the client's)."""
    _, pod, _, _ = setup

    def broken():
        raise RuntimeError("bug")

    pod.catalog.context_windows = broken
    transport = httpx.ASGITransport(app=create_app(pod), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=DEV_AUTH) as client:
        return await client.post("/v1/completions", json={"model": "llmq-sim", "prompt": "a"})

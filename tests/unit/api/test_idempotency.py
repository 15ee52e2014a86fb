"""idempotency.py: key syntax, fingerprints, claims (first wins, released only by their owner), result lookups."""

import asyncio

import msgspec
import pytest

from llmq_api.errors import ApiError
from llmq_api.idempotency import Claim, IdempotencyStore, fingerprint, parse_key
from llmq_api.validation import parse_completion
from llmq_api.waiters import Waiter, WaiterRegistry
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from tests.fakes import FakeRedis
from tests.unit.api.fakes import Trigger, final

MODELS = {"llmq-sim": 0}


@pytest.mark.parametrize("value", ["", " ", "a" * 256, "tab\there", "ünïcode"])
def test_bad_keys_are_400(value):
    with pytest.raises(ApiError) as info:
        parse_key(value)
    assert (info.value.status, info.value.param) == (400, "idempotency-key")


def test_keys_are_trimmed_and_absent_is_none():
    assert parse_key(" order 42 ") == "order 42" and parse_key("x" * 255) == "x" * 255 and parse_key(None) is None


def test_fingerprint_covers_parameters_and_class_not_formatting():
    a = parse_completion(b'{"model": "llmq-sim", "prompt": "hi", "max_tokens": 3}', MODELS)
    same = parse_completion(b'{"max_tokens": 3,  "prompt": "hi", "model": "llmq-sim"}', MODELS)
    other = parse_completion(b'{"model": "llmq-sim", "prompt": "hi", "max_tokens": 4}', MODELS)
    assert fingerprint(a, "interactive") == fingerprint(same, "interactive")
    assert fingerprint(a, "interactive") != fingerprint(other, "interactive")
    assert fingerprint(a, "interactive") != fingerprint(a, "deferred")


async def test_first_claim_wins_and_only_its_owner_releases_it():
    redis, clock = FakeRedis(), FakeClock(1_000)
    store = IdempotencyStore(redis, clock, result_ttl_ms=60_000)
    first = Claim(request_id="cmpl-1", fingerprint="f", deadline_ms=31_000)
    assert await store.claim("acme", "k", first) is None
    assert await store.claim("acme", "k", Claim(request_id="cmpl-2", fingerprint="f", deadline_ms=9)) == first
    assert await store.claim("other-tenant", "k", Claim(request_id="cmpl-3", fingerprint="f", deadline_ms=9)) is None
    await store.release("acme", "k", "cmpl-2")  # not the owner: nothing happens
    assert await store.find("acme", "k") == first
    await store.release("acme", "k", "cmpl-1")
    assert await store.find("acme", "k") is None
    assert msgspec.json.decode(redis.data[constants.idempotency_key("other-tenant", "k")])["request_id"] == "cmpl-3"


async def test_results_are_read_from_the_result_store():
    redis = FakeRedis()
    store = IdempotencyStore(redis, FakeClock(), result_ttl_ms=1)
    redis.data[constants.result_key("cmpl-1")] = wire.encode(final("cmpl-1"))
    redis.data[constants.result_key("cmpl-bad")] = b"\xc1garbage"
    assert (await store.result("cmpl-1")).choices[0].text == "hello"
    assert await store.result("cmpl-bad") is None and await store.result("cmpl-none") is None


async def test_follow_resolves_the_waiter_once_the_result_is_stored():
    redis, clock, polled, wake = FakeRedis(), FakeClock(), Trigger(), Trigger()

    async def sleep(seconds: float) -> None:  # between polls: tells the test, then waits until it says go on
        polled.fire()
        await wake.wait()

    store, registry = IdempotencyStore(redis, clock, result_ttl_ms=1, sleep=sleep), WaiterRegistry(10)
    waiter = Waiter("cmpl-1", stream=False)
    follower = asyncio.create_task(store.follow(waiter, registry, until_ms=clock.now_ms() + 10_000))
    await asyncio.wait_for(polled.wait(), 1)  # it looked and found no result yet
    assert not waiter.done
    redis.data[constants.result_key("cmpl-1")] = wire.encode(final("cmpl-1"))
    wake.fire()
    await asyncio.wait_for(follower, 1)
    assert waiter.resolution.request_id == "cmpl-1"
    clock.advance(20_000)  # past its end: returns without a result
    await asyncio.wait_for(store.follow(Waiter("cmpl-2", stream=False), registry, until_ms=1), 1)

"""ratelimit.py around its Lua script (the script itself runs against real Redis in tests/integration)."""

import asyncio
import json

import msgspec
import pytest

from llmq_api.auth import Principal
from llmq_api.errors import ApiError
from llmq_api.exchange import CLIENT_GONE_REASON, SHUTDOWN_REASON
from llmq_api.ratelimit import Charge, RateLimiter, check_batch_fits, check_fits, token_cost
from llmq_api.validation import ValidRequest, parse_chat, parse_completion
from llmq_api.waiters import Abandoned, DeadlineExceeded
from llmq_core import wire
from llmq_core.clock import FakeClock
from llmq_core.constants import MAX_RESULT_BYTES
from tests.fakes import FakeRedis
from tests.unit.api.fakes import final, refusal


def completion(**params) -> ValidRequest:
    return parse_completion(json.dumps({"model": "m", "prompt": "abcd", **params}).encode(), {"m": 0})


def test_token_cost_is_prompt_plus_the_most_it_may_generate():
    assert token_cost(completion(max_tokens=5, n=3)) == 4 + 15
    assert token_cost(completion(n=2)) == 4 + 2 * 16  # a missing max_tokens runs with its default


def test_the_estimate_stays_within_the_context_window_and_the_result_cap():
    assert token_cost(completion(max_tokens=5000), context_window=1000) == 4 + 996
    # Validation refuses n x max_tokens over the cap; a request that passes it some other way (a Kafka-direct or
    # future default) is still estimated within the cap.
    over_cap = msgspec.structs.replace(completion(n=128), sampling=wire.SamplingParams(max_tokens=10**9, n=128))
    assert token_cost(over_cap) == 4 + 128 * (MAX_RESULT_BYTES // 128)


@pytest.mark.parametrize(
    "params, param",
    [
        ({"n": 100, "max_tokens": 8000}, "max_tokens"),
        ({"n": 100, "max_tokens": 10}, "n"),
        ({"max_tokens": 999}, "max_tokens"),
    ],
)
def test_an_estimate_over_the_bucket_size_is_a_400_naming_what_to_lower(params, param):
    valid = completion(**params)
    with pytest.raises(ApiError) as refused:
        check_fits(token_cost(valid), 1000, valid)
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "tokens_exceed_limit", param)
    assert f"estimate is {token_cost(valid)}" in error.message and "limit is 1000" in error.message


def test_an_estimate_within_the_bucket_or_without_a_limit_passes():
    valid = completion(n=100, max_tokens=8000)
    check_fits(token_cost(valid), 0, valid)
    check_fits(1000, 1000, completion(max_tokens=996))


def test_a_prompt_over_the_bucket_names_the_prompt():
    valid = parse_chat(b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}', {"m": 0})
    with pytest.raises(ApiError) as refused:
        check_fits(token_cost(valid), 1000, valid)
    assert refused.value.param == "messages"


def test_a_batch_over_the_quota_is_a_400_and_the_quota_defaults_to_a_day_of_tokens_per_min():
    check_batch_fits(1440 * 10, Principal(tenant_id="t", tokens_per_min=10))
    check_batch_fits(10**12, Principal(tenant_id="t"))
    with pytest.raises(ApiError) as refused:
        check_batch_fits(1440 * 10 + 1, Principal(tenant_id="t", tokens_per_min=10))
    assert (refused.value.status, refused.value.code) == (400, "batch_tokens_exceed_quota")
    with pytest.raises(ApiError):
        check_batch_fits(101, Principal(tenant_id="t", tokens_per_min=10, batch_tokens_per_day=100))


async def settled(redis: FakeRedis, charge: Charge, resolution=None, cancel: bool = False) -> list:
    charge.cancel() if cancel else charge.settle(resolution)
    charge.settle(final("again"))  # a second ending changes nothing
    await charge.limiter.drain()
    return [args[1:] for _, args in redis.gives]


@pytest.mark.parametrize(
    "resolution, refund",
    [
        (final("r", text="abc"), [1, 60_000, 0, 100, 60_000, 60 - 3 - 3]),  # usage: 3 prompt + 3 completion tokens
        (final("r", text="x" * 99), []),  # used more than the estimate: the estimate is kept, nothing more taken
        (DeadlineExceeded(), []),
        (Abandoned(CLIENT_GONE_REASON), []),  # may have run: the estimate stands
        (Abandoned(SHUTDOWN_REASON), [1, 60_000, 0, 100, 60_000, 60]),  # told to retry: nothing kept
    ],
)
async def test_a_charge_settles_once_by_the_real_usage(resolution, refund):
    redis, principal = FakeRedis(), Principal(tenant_id="t", requests_per_min=1, tokens_per_min=100)
    charge = Charge(RateLimiter(redis, FakeClock()), principal, 60)
    assert await settled(redis, charge, resolution) == ([refund] if refund else [])


async def test_a_cancelled_charge_gives_back_the_request_too():
    redis, principal = FakeRedis(), Principal(tenant_id="t", requests_per_min=1, tokens_per_min=100)
    charge = Charge(RateLimiter(redis, FakeClock()), principal, 60)
    assert await settled(redis, charge, cancel=True) == [[1, 60_000, 1, 100, 60_000, 60]]


async def test_unlimited_principals_never_touch_redis():
    redis = FakeRedis()
    assert await RateLimiter(redis, FakeClock()).acquire(Principal(tenant_id="t"), 10) is None
    assert redis.takes == []


async def test_script_gets_both_buckets_and_the_clock():
    redis, clock = FakeRedis(), FakeClock(5_000)
    principal = Principal(tenant_id="acme", requests_per_min=60, tokens_per_min=1000)
    assert await RateLimiter(redis, clock).acquire(principal, 42) is None
    assert redis.takes == [
        (["llmq:ratelimit:acme:requests", "llmq:ratelimit:acme:tokens"], [5_000, 60, 60_000, 1, 1000, 60_000, 42])
    ]


async def test_refusal_names_the_bucket_and_rounds_the_wait_up():
    redis = FakeRedis()
    redis.take_reply = [0, 2_500, 2]
    rejection = await RateLimiter(redis, FakeClock()).acquire(Principal(tenant_id="t", tokens_per_min=100), 500)
    assert refusal(rejection) == ("tenant_tokens", 429, "tokens", "rate_limit_exceeded", None, {"retry-after": "3"})
    assert "tokens per min: limit 100" in rejection.error.message


async def test_redis_trouble_lets_requests_through():
    class Broken(FakeRedis):
        def register_script(self, script):
            async def run(keys, args):
                raise ConnectionError("down")

            return run

    limiter = RateLimiter(Broken(), FakeClock())
    assert await limiter.acquire(Principal(tenant_id="t", requests_per_min=1), 1) is None


async def test_a_batch_draws_from_its_daily_bucket_and_an_uncreated_batch_gets_it_back():
    redis, clock = FakeRedis(), FakeClock(5_000)
    principal = Principal(tenant_id="acme", requests_per_min=60, tokens_per_min=10)
    limiter = RateLimiter(redis, clock)
    assert await limiter.acquire_batch(principal, 900) is None
    await limiter.refund_batch(principal, 900)
    day = [5_000, 14_400, 86_400_000, 900]  # 1440 x tokens_per_min per day
    assert redis.takes == redis.gives == [(["llmq:ratelimit:acme:batch_tokens"], day)]


async def test_an_unlimited_tenant_settles_without_a_task():
    limiter = RateLimiter(FakeRedis(), FakeClock())
    Charge(limiter, Principal(tenant_id="t"), 60).cancel()
    assert limiter._settling == set()


@pytest.mark.parametrize("wait_ms, retry, should_retry", [(52_117_000, "52117", "false"), (30_000, "30", "true")])
async def test_a_short_daily_quota_says_when_it_resets_and_whether_a_quick_retry_can_help(wait_ms, retry, should_retry):
    redis, clock = FakeRedis(), FakeClock(1_700_000_000_000)
    redis.take_reply = [0, wait_ms, 1]
    rejection = await RateLimiter(redis, clock).acquire_batch(Principal(tenant_id="acme", tokens_per_min=10), 900)
    headers = rejection.error.response_headers()
    assert rejection.error.status == 429 and headers["retry-after"] == retry
    assert headers["x-should-retry"] == should_retry  # SDKs ignore a Retry-After past 60 s and retry at once
    reset = "2023-11-14T22:" if wait_ms < 60_000 else "2023-11-15T"
    assert f"(at {reset}" in rejection.error.message


class StalledRedis(FakeRedis):
    """Its scripts answer only once ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()

    def register_script(self, script: str):
        run = super().register_script(script)

        async def stalled(keys: list, args: list):
            await self.answer.wait()
            return await run(keys, args)

        return stalled


async def test_a_check_slower_than_the_timeout_lets_the_request_through():
    redis, principal = StalledRedis(), Principal(tenant_id="t", requests_per_min=1)
    redis.take_reply = [0, 60_000, 1]  # a refusal, had it come in time
    assert await RateLimiter(redis, FakeClock(), timeout_s=0.01).acquire(principal, 1) is None


async def test_a_check_within_the_timeout_is_kept():
    redis, principal = StalledRedis(), Principal(tenant_id="t", requests_per_min=1)
    redis.take_reply = [0, 60_000, 1]
    asyncio.get_running_loop().call_soon(redis.answer.set)
    refused = await RateLimiter(redis, FakeClock(), timeout_s=30).acquire(principal, 1)
    assert refused is not None and refused.reason == "tenant_requests"

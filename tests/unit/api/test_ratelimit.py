"""ratelimit.py around its Lua script (the script itself runs against real Redis in tests/integration)."""

from llmq_core.clock import FakeClock
from llmq_api.auth import Principal
from llmq_api.ratelimit import RateLimiter, token_cost
from llmq_api.validation import parse_completion
from tests.unit.api.fakes import FakeRedis


def test_token_cost_is_prompt_plus_the_most_it_may_generate():
    valid = parse_completion(b'{"model": "m", "prompt": "abcd", "max_tokens": 5, "n": 3}', {"m": 0})
    assert token_cost(valid) == 4 + 15


async def test_unlimited_principals_never_touch_redis():
    redis = FakeRedis()
    assert await RateLimiter(redis, FakeClock()).acquire(Principal(tenant_id="t"), 10) is None
    assert redis.takes == []


async def test_script_gets_both_buckets_and_the_clock():
    redis, clock = FakeRedis(), FakeClock(5_000)
    principal = Principal(tenant_id="acme", requests_per_min=60, tokens_per_min=1000)
    assert await RateLimiter(redis, clock).acquire(principal, 42) is None
    assert redis.takes == [(["llmq:ratelimit:acme:requests", "llmq:ratelimit:acme:tokens"], [5_000, 60, 1, 1000, 42])]


async def test_refusal_names_the_bucket_and_rounds_the_wait_up():
    redis = FakeRedis()
    redis.take_reply = [0, 2_500, 2]
    rejection = await RateLimiter(redis, FakeClock()).acquire(Principal(tenant_id="t", tokens_per_min=100), 500)
    error = rejection.error
    assert rejection.reason == "tenant_tokens"
    assert (error.status, error.type, error.code, error.headers) == (429, "tokens", "rate_limit_exceeded",
                                                                     {"retry-after": "3"})
    assert "tokens per min: limit 100" in error.message


async def test_redis_trouble_lets_requests_through():
    class Broken(FakeRedis):
        def register_script(self, script):
            async def run(keys, args):
                raise ConnectionError("down")
            return run

    limiter = RateLimiter(Broken(), FakeClock())
    assert await limiter.acquire(Principal(tenant_id="t", requests_per_min=1), 1) is None

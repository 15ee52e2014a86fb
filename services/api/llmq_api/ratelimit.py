"""Per-tenant limits shared by every API pod: token buckets per tenant in Redis, taken and refilled by Lua scripts.

Bucket ``requests`` holds up to ``requests_per_min`` and refills at that rate per minute; bucket ``tokens`` the
same with ``tokens_per_min``. A generation request is charged at admission with its estimate (:func:`token_cost`:
prompt tokens plus ``n`` times the most each choice may generate) and settled when it ends (:class:`Charge`): the
part of the estimate it did not use is refunded. An estimate above the bucket's size could never be admitted and is
refused with a 400 (:func:`check_fits`): a 429 would make SDKs retry in vain. Batch jobs draw from a third bucket,
``batch_tokens`` (``batch_tokens_per_day``, by default 1440 x ``tokens_per_min``), charged with the estimate of all of
a job's lines at create. A request passes only when every bucket it draws from holds enough; a refused request takes
nothing. Time comes from the pod's injected clock. Redis unreachable lets requests through (logged): the pod's own
admission control still bounds the load; Redis refusing the write (maxmemory) answers 503 ``store_unavailable``,
or every tenant's limits would lapse while it is full.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from llmq_api.admission import MAX_RETRY_AFTER_S, Rejection, retry_after_s, too_many_requests
from llmq_api.auth import Principal
from llmq_api.errors import ApiError, invalid, store_unavailable
from llmq_api.exchange import SHUTDOWN_REASON
from llmq_api.validation import ValidRequest
from llmq_api.waiters import Abandoned, Resolution
from llmq_core import wire
from llmq_core.clock import Clock
from llmq_core.constants import MAX_RESULT_BYTES, ratelimit_key
from llmq_core.settings import ApiSettings

log = logging.getLogger(__name__)

TIMEOUT_S = ApiSettings.model_fields["rate_limit_timeout_ms"].default / 1000  # the setting's default
MINUTE_MS = 60_000
DAY_MS = 86_400_000
REQUESTS_BUCKET = "requests"
TOKENS_BUCKET = "tokens"
BATCH_BUCKET = "batch_tokens"

# KEYS: the buckets. ARGV: now_ms, then (limit per period, period ms, cost) per bucket (limit 0: none).
# Levels are kept in tokens x period ms, so refills of `limit` per ms stay whole numbers.
# Returns {1, 0, 0} when taken, {0, wait_ms, bucket number} when refused.
_TAKE = """
local now = tonumber(ARGV[1])
local after, stamp, wait, which = {}, {}, 0, 0
for i = 1, #KEYS do
  local limit, period, cost = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if limit > 0 then
    local size = limit * period
    local state = redis.call('HMGET', KEYS[i], 'level', 'ms')
    local level, last = tonumber(state[1]) or size, tonumber(state[2]) or now
    level = math.min(size, level + math.max(0, now - last) * limit)
    cost = math.min(cost * period, size)
    after[i], stamp[i] = level - cost, math.max(now, last)
    if level < cost then
      local need = math.ceil((cost - level) / limit)
      if need > wait then wait, which = need, i end
    end
  end
end
if wait > 0 then return {0, wait, which} end
for i = 1, #KEYS do
  if after[i] then
    redis.call('HSET', KEYS[i], 'level', string.format('%d', after[i]), 'ms', string.format('%d', stamp[i]))
    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[3 * i]))
  end
end
return {1, 0, 0}
"""

# KEYS and ARGV as _TAKE, with amounts to give back instead of costs. A bucket whose key is gone is full already.
_GIVE = """
local now = tonumber(ARGV[1])
for i = 1, #KEYS do
  local limit, period, amount = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local state = redis.call('HMGET', KEYS[i], 'level', 'ms')
  if limit > 0 and amount > 0 and state[1] then
    local last = tonumber(state[2])
    local level = math.min(limit * period, tonumber(state[1]) + math.max(0, now - last) * limit + amount * period)
    redis.call('HSET', KEYS[i], 'level', string.format('%d', level), 'ms', string.format('%d', math.max(now, last)))
  end
end
return 1
"""


@dataclass(frozen=True, slots=True)
class Draw:
    """What one call takes from (or gives back to) one bucket: ``limit`` per ``period_ms`` (0: unlimited)."""

    bucket: str
    limit: int
    period_ms: int
    amount: int


def effective_max_tokens(valid: ValidRequest, context_window: int) -> int:
    """The most one choice may generate: ``max_tokens`` (a missing one is already its default), within the context
    window left after the prompt (0: unknown) and within its share of the result byte cap (a token is at least a
    byte: the workers stop there)."""
    bounds = [valid.sampling.max_tokens, MAX_RESULT_BYTES // valid.sampling.n]
    if context_window > 0:
        bounds.append(max(0, context_window - valid.prompt_tokens))
    return min(bounds)


def token_cost(valid: ValidRequest, context_window: int = 0) -> int:
    """A request's estimate, what it is charged at admission: its prompt tokens plus ``n`` x the most each choice may
    generate (:func:`effective_max_tokens`)."""
    return valid.prompt_tokens + valid.sampling.n * effective_max_tokens(valid, context_window)


def check_fits(estimate: int, limit: int, valid: ValidRequest) -> None:
    """Raise a 400 naming the parameter to lower when ``estimate`` exceeds a bucket of size ``limit`` (0: none)."""
    if not limit or estimate <= limit:
        return
    n, prompt = valid.sampling.n, valid.prompt_tokens
    per_choice = (estimate - prompt) // n
    if prompt >= limit:
        param = "prompt" if valid.endpoint == "completions" else "messages"
    else:
        param = "n" if n > 1 and prompt + per_choice <= limit else "max_tokens"
    raise invalid(
        f"This request could never be admitted: its token estimate is {estimate} (prompt {prompt} + n {n} "
        f"x max_tokens {per_choice}), but this API key's tokens per min limit is {limit}. Lower '{param}' "
        "(a 400, not a 429: retrying the same request cannot succeed)",
        param=param,
        code="tokens_exceed_limit",
    )


def used_tokens(resolution: Resolution) -> int | None:
    """Tokens a request really spent, known from its result; None when the pod gave up on it (deadline, client gone:
    the work may have run, so the estimate stands). A pod shutdown told the client to retry: it spent nothing."""
    if isinstance(resolution, wire.FinalResult):
        return resolution.usage.prompt_tokens + resolution.usage.completion_tokens
    if isinstance(resolution, Abandoned) and resolution.reason == SHUTDOWN_REASON:
        return 0
    return None


class RateLimiter:
    """Takes from a tenant's buckets (see the module doc); ``acquire`` answers None or a 429 Rejection.

    ``timeout_s``: how long a take or a refund may wait on Redis before the request is let through unlimited (fail
    open: a slow store must not stall admission)."""

    def __init__(self, redis: Redis, clock: Clock, timeout_s: float = TIMEOUT_S) -> None:
        self._take = redis.register_script(_TAKE)
        self._give = redis.register_script(_GIVE)
        self._clock = clock
        self._timeout_s = timeout_s
        self._settling: set[asyncio.Task] = set()

    async def acquire(self, principal: Principal, tokens: int) -> Rejection | None:
        """Charge one request of ``tokens`` to ``principal``'s tenant; a Rejection when a bucket is short."""
        return await self._draw(
            principal,
            [
                Draw(REQUESTS_BUCKET, principal.requests_per_min, MINUTE_MS, 1),
                Draw(TOKENS_BUCKET, principal.tokens_per_min, MINUTE_MS, tokens),
            ],
        )

    async def acquire_batch(self, principal: Principal, tokens: int) -> Rejection | None:
        """Charge a batch job of ``tokens`` (all its lines' estimates) to the tenant's daily batch quota."""
        return await self._draw(principal, [Draw(BATCH_BUCKET, batch_tokens_per_day(principal), DAY_MS, tokens)])

    async def refund(self, principal: Principal, tokens: int, requests: int = 0) -> None:
        """Give back ``tokens`` (and ``requests``) taken by :meth:`acquire`; best effort, never raises."""
        await self._give_back(
            principal,
            [
                Draw(REQUESTS_BUCKET, principal.requests_per_min, MINUTE_MS, requests),
                Draw(TOKENS_BUCKET, principal.tokens_per_min, MINUTE_MS, tokens),
            ],
        )

    async def refund_batch(self, principal: Principal, tokens: int) -> None:
        """Give back a batch charge of :meth:`acquire_batch` whose job was not created; never raises."""
        await self._give_back(principal, [Draw(BATCH_BUCKET, batch_tokens_per_day(principal), DAY_MS, tokens)])

    async def _give_back(self, principal: Principal, draws: Sequence[Draw]) -> None:
        if not any(d.limit and d.amount for d in draws):
            return
        try:
            await asyncio.wait_for(self._give(keys=_keys(principal, draws), args=self._args(draws)), self._timeout_s)
        except Exception as exc:
            log.warning("rate limit refund to %s failed: %r", principal.tenant_id, exc)

    def settle_later(self, principal: Principal, tokens: int, requests: int = 0) -> None:
        """:meth:`refund` in the background (callers may be cancelled); :meth:`drain` awaits what is still running."""
        task = asyncio.ensure_future(self.refund(principal, tokens, requests))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def drain(self) -> None:
        await asyncio.gather(*self._settling, return_exceptions=True)

    async def _draw(self, principal: Principal, draws: Sequence[Draw]) -> Rejection | None:
        if not any(d.limit for d in draws):
            return None
        try:
            taken, wait_ms, which = await asyncio.wait_for(
                self._take(keys=_keys(principal, draws), args=self._args(draws)), self._timeout_s
            )
        except ResponseError as exc:  # Redis refuses writes (maxmemory): limits cannot be kept, so refuse the request
            raise store_unavailable(exc) from None
        except Exception as exc:
            log.warning("rate limit check failed, letting the request through: %r", exc)
            return None
        if taken:
            return None
        draw = draws[which - 1]
        per = "min" if draw.period_ms == MINUTE_MS else "day"
        retry_s = retry_after_s(wait_ms) if draw.period_ms == MINUTE_MS else max(1, math.ceil(wait_ms / 1000))
        at = datetime.fromtimestamp((self._clock.now_ms() + wait_ms) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = (
            f"Rate limit reached for tenant {principal.tenant_id} on {draw.bucket} per {per}: limit "
            f"{draw.limit}. Please try again in {retry_s}s (at {at})."
        )
        error = too_many_requests(message, retry_s, type=draw.bucket)
        # SDKs ignore a Retry-After past a minute and retry at once: say a quick retry cannot help (x-should-retry)
        error.retryable = retry_s <= MAX_RETRY_AFTER_S
        return Rejection(f"tenant_{draw.bucket}", error)

    def _args(self, draws: Sequence[Draw]) -> list[int]:
        args = [self._clock.now_ms()]
        for draw in draws:
            args += [draw.limit, draw.period_ms, draw.amount]
        return args


def _keys(principal: Principal, draws: Sequence[Draw]) -> list[str]:
    return [ratelimit_key(principal.tenant_id, draw.bucket) for draw in draws]


def batch_tokens_per_day(principal: Principal) -> int:
    """The tenant's batch quota: its own, else the day's worth of its per-minute tokens (0: unlimited)."""
    return principal.batch_tokens_per_day or principal.tokens_per_min * 1440


def check_batch_fits(estimate: int, principal: Principal) -> None:
    """Raise a 400 when a batch's total estimate exceeds the tenant's batch quota: it could never be created."""
    limit = batch_tokens_per_day(principal)
    if limit and estimate > limit:
        raise ApiError(
            400,
            f"This batch could never run: its lines' token estimate is {estimate} (prompt tokens + "
            f"n x max_tokens per line), but this API key's batch tokens per day quota is {limit}. Split "
            "the file or lower 'max_tokens' / 'n' in its lines (a 400, not a 429: retrying cannot "
            "succeed)",
            param="input_file_id",
            code="batch_tokens_exceed_quota",
        )


@dataclass(eq=False, repr=False)
class Charge:
    """One admitted request's charge of ``estimate`` tokens, settled once when it ends: what it did not use (by its
    result's usage; never more than the estimate is kept) goes back to the bucket."""

    limiter: RateLimiter
    principal: Principal
    estimate: int
    on_end: Callable[[], None] | None = None  # called once when settled or cancelled (ended or never queued)
    settled: bool = field(init=False, default=False)

    def settle(self, resolution: Resolution) -> None:
        """Settle by the request's resolution (see :func:`used_tokens`)."""
        used = used_tokens(resolution)
        self._settle(self.estimate if used is None else used, requests=0)

    def cancel(self) -> None:
        """The request was never queued (produce failed, an idempotent retry joined an earlier one): give all back."""
        self._settle(0, requests=1)

    def _settle(self, used: int, requests: int) -> None:
        if self.settled:
            return
        self.settled = True
        if self.on_end is not None:
            self.on_end()
        unused = self.estimate - min(max(used, 0), self.estimate)
        limited = self.principal.requests_per_min or self.principal.tokens_per_min
        if limited and (unused or requests):  # an unlimited tenant's requests cost the hot path no task
            self.limiter.settle_later(self.principal, unused, requests)

"""One Kafka reply per result across router kills and rebalances (llmq_result_router.once): the pure claim decision,
and the claim loop on a fake Redis with a fake reply finder and an injected clock and sleep.

Found by test_fleet_delivery: a router killed mid-job left 3 of 81 replies delivered twice (it had produced them, then
died before marking them delivered; the next owner of its partitions produced them again)."""

from __future__ import annotations

import pytest

from llmq_core import constants
from llmq_core.clock import FakeClock
from llmq_core.metrics import RouterMetrics
from llmq_result_router.once import CLOCK_SKEW_MS, DELIVERED, Claim, DeliveryClaims, Step, plan_claim
from tests.fakes import FakeRedis

NOW_MS = 1_700_000_000_000
ME, OTHER = "router-b", "router-a"
KEY = constants.delivered_key("req-1")
LEASE_MS = 1_000


def held(owner: str = OTHER, claimed_ms: int = NOW_MS - 100, lease_ms: int = LEASE_MS) -> bytes:
    return Claim(owner, claimed_ms, claimed_ms + lease_ms).encode()


@pytest.mark.parametrize(
    ("found", "alive", "step"),
    [
        (None, False, Step.PRODUCE),  # claimed now
        (DELIVERED, True, Step.SKIP),
        (b"something else", True, Step.SKIP),  # not written by this code: never risk a second reply
        (held(), True, Step.WAIT),  # a live router within its lease is producing it
        (held(), False, Step.SEARCH),  # its router is gone: did its produce land?
        (held(claimed_ms=NOW_MS - 2 * LEASE_MS), True, Step.SEARCH),  # lease over: its produce landed or failed
        (held(owner=ME), True, Step.SEARCH),  # this router's own, from a try that ended with an error
    ],
)
def test_plan_claim(found, alive, step):
    assert plan_claim(found, ME, NOW_MS, alive).step is step


def test_a_wait_never_outlasts_the_lease_and_a_search_starts_before_the_claim_by_the_clock_skew():
    assert plan_claim(held(claimed_ms=NOW_MS - LEASE_MS + 10), ME, NOW_MS, True).wait_ms == 10
    assert plan_claim(held(), ME, NOW_MS, False).since_ms == NOW_MS - 100 - CLOCK_SKEW_MS


def test_a_claim_round_trips_and_a_malformed_one_is_none():
    claim = Claim("eu-router-1", NOW_MS, NOW_MS + 5)
    assert Claim.decode(claim.encode()) == claim
    assert Claim.decode(b"c eu-router-1 soon later") is None
    assert Claim.decode(b"c a b") is None


class Finder:
    def __init__(self, found: bool) -> None:
        self.found = found
        self.searches: list[tuple] = []

    async def find(self, topic, key, delivery_id, since_ms) -> bool:
        self.searches.append((topic, key, delivery_id, since_ms))
        return self.found


class Setup:
    def __init__(self, *, found: bool = False, alive: tuple[str, ...] = ()) -> None:
        self.clock = FakeClock(NOW_MS)
        self.redis = FakeRedis()
        for owner in alive:
            self.redis.data[constants.alive_key("result-router", owner)] = b"{}"
        self.finder = Finder(found)
        self.metrics = RouterMetrics()
        self.produced = 0
        self.on_sleep = lambda: None
        self.claims = DeliveryClaims(
            self.redis,
            self.clock,
            ME,
            lease_ms=LEASE_MS,
            ttl_ms=60_000,
            finder=self.finder,
            metrics=self.metrics,
            sleep=self.sleep,
        )

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(round(seconds * 1000))
        self.on_sleep()

    async def produce(self) -> None:
        assert self.redis.data[KEY].startswith(b"c " + ME.encode()), "produced without holding the claim"
        self.produced += 1

    async def once(self):
        return await self.claims.once(KEY, "team.replies", b"req-1", self.produce)

    def searches(self, outcome: str) -> float:
        return self.metrics.reply_searches.labels(outcome)._value.get()


async def test_a_fresh_reply_is_claimed_produced_and_marked_and_its_redelivery_skipped():
    setup = Setup()
    assert await setup.once() is None
    assert await setup.once() is Step.SKIP
    assert setup.produced == 1 and setup.redis.data[KEY] == DELIVERED and setup.finder.searches == []


async def test_the_claim_of_a_killed_router_whose_reply_landed_is_marked_without_producing_again():
    setup = Setup(found=True)
    setup.redis.data[KEY] = held()
    assert await setup.once() is Step.SKIP
    assert setup.produced == 0 and setup.redis.data[KEY] == DELIVERED
    assert setup.finder.searches == [("team.replies", b"req-1", KEY.encode(), NOW_MS - 100 - CLOCK_SKEW_MS)]
    assert setup.searches("found") == 1


async def test_the_claim_of_a_killed_router_whose_reply_never_landed_is_taken_over_and_produced_once():
    setup = Setup(found=False)
    setup.redis.data[KEY] = held()
    assert await setup.once() is None
    assert setup.produced == 1 and setup.redis.data[KEY] == DELIVERED and setup.searches("not_found") == 1


async def test_a_live_router_producing_the_reply_is_waited_for_and_its_mark_ends_the_wait():
    setup = Setup(alive=(OTHER,))
    setup.redis.data[KEY] = held()
    sleeps = []

    def mark_on_third_look():
        sleeps.append(setup.clock.now_ms())
        if len(sleeps) == 3:
            setup.redis.data[KEY] = DELIVERED

    setup.on_sleep = mark_on_third_look
    assert await setup.once() is Step.SKIP
    assert setup.produced == 0 and len(sleeps) == 3 and setup.finder.searches == []


async def test_a_live_router_past_its_lease_is_searched_for_then_taken_over():
    setup = Setup(alive=(OTHER,))
    setup.redis.data[KEY] = held()
    assert await setup.once() is None
    assert setup.clock.now_ms() >= NOW_MS - 100 + LEASE_MS  # waited out the lease, no longer
    assert setup.clock.now_ms() < NOW_MS - 100 + LEASE_MS + 100
    assert setup.produced == 1 and len(setup.finder.searches) == 1


async def test_a_claim_taken_by_a_third_router_meanwhile_is_not_overwritten():
    setup = Setup(found=False, alive=("router-c",))
    setup.redis.data[KEY] = held()
    search = setup.finder.find

    async def third_router_takes_it(*args):
        setup.redis.data[KEY] = held(owner="router-c", claimed_ms=setup.clock.now_ms())
        setup.on_sleep = lambda: setup.redis.data.__setitem__(KEY, DELIVERED)  # ... and delivers it
        return await search(*args)

    setup.finder.find = third_router_takes_it
    assert await setup.once() is Step.SKIP
    assert setup.produced == 0

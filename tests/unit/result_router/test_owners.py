"""The owner watcher (fencing across regions): it follows this region's owners topic and every configured peer's
mirrored one into the store, keeps only the claims of the region whose topic holds them, says when it has read what
they held at start, and until then the job driver drives nothing."""

import asyncio

import msgspec
from aiokafka import TopicPartition

from llmq_core.settings import Settings
from llmq_jobs.jobs import JobOwner
from llmq_result_router.jobs import JobDriver
from llmq_result_router.owners import OwnerWatcher
from tests.fakes import Record

OWN, PEER = TopicPartition("llmq.jobs.owners", 0), TopicPartition("a.llmq.jobs.owners", 0)
CLAIMS = {
    OWN: [JobOwner(batch_id="batch_1", region="b", epoch=1)],
    PEER: [JobOwner(batch_id="batch_1", region="a"), JobOwner(batch_id="batch_2", region="a")],
}


class Consumer:
    """A group-less consumer over fixed topics: each partition's records from the start."""

    def __init__(self, topics: set[str], records: dict[TopicPartition, list[JobOwner]]) -> None:
        self._topics = topics
        self.records = {tp: [msgspec.json.encode(c) for c in claims] for tp, claims in records.items()}
        self.assigned: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}

    async def topics(self) -> set[str]:
        return self._topics

    def assign(self, partitions) -> None:
        self.assigned = list(partitions)

    async def seek_to_beginning(self, *partitions) -> None:
        self.positions.update({tp: 0 for tp in partitions})

    async def end_offsets(self, partitions) -> dict:
        return {tp: len(self.records.get(tp, [])) for tp in partitions}

    async def position(self, tp) -> int:
        return self.positions[tp]

    async def getmany(self, timeout_ms: int = 0) -> dict:
        out = {}
        for tp in self.assigned:
            values = self.records.get(tp, [])[self.positions[tp] :]
            if values:
                out[tp] = [Record(self.positions[tp] + i, v, topic=tp.topic) for i, v in enumerate(values)]
                self.positions[tp] += len(values)
        await asyncio.sleep(0)
        return out


class Claims:
    """A job store whose owners part records the claims raised."""

    def __init__(self) -> None:
        self.raised: list[JobOwner] = []
        self.owners = self

    async def raise_owner(self, claim: JobOwner) -> bool:
        self.raised.append(claim)
        return True


async def test_the_watcher_applies_every_owners_topics_claims_then_says_it_caught_up():
    store = Claims()
    consumer = Consumer({OWN.topic, PEER.topic, "a.llmq.jobs.ledger", "llmq.results"}, CLAIMS)
    watcher = OwnerWatcher(store, consumer, "b", ("a",))
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.caught_up.wait(), 5)
    watcher.stop()
    await task
    assert sorted(consumer.assigned) == sorted([OWN, PEER])
    assert sorted(store.raised, key=lambda c: (c.batch_id, c.epoch)) == sorted(
        CLAIMS[OWN] + CLAIMS[PEER], key=lambda c: (c.batch_id, c.epoch)
    )


async def test_each_peer_claim_that_raised_a_jobs_owner_is_told_as_a_move():
    moves = []
    watcher = OwnerWatcher(Claims(), Consumer({OWN.topic, PEER.topic}, CLAIMS), "b", ("a",), moves.append)
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.caught_up.wait(), 5)
    watcher.stop()
    await task
    assert sorted(moves, key=lambda c: c.batch_id) == CLAIMS[PEER]  # this region's own claim is no move


async def test_claims_of_other_regions_and_of_regions_that_are_not_peers_are_dropped():
    """Issue 34, item 2: one record naming region "zzz" on this region's owners topic froze a running job for good.
    A claim counts only where it names the region whose topic holds it, and a region not among the peers is not
    followed at all."""
    zzz = TopicPartition("zzz.llmq.jobs.owners", 0)
    forged = {
        OWN: [JobOwner(batch_id="batch_1", region="zzz", epoch=7), JobOwner(batch_id="batch_1", region="a", epoch=8)],
        PEER: [JobOwner(batch_id="batch_2", region="b", epoch=9), JobOwner(batch_id="batch_2", region="a", epoch=1)],
        zzz: [JobOwner(batch_id="batch_1", region="zzz", epoch=7)],
    }
    store = Claims()
    watcher = OwnerWatcher(store, Consumer({OWN.topic, PEER.topic, zzz.topic}, forged), "b", ("a",))
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.caught_up.wait(), 5)
    watcher.stop()
    await task
    assert store.raised == [JobOwner(batch_id="batch_2", region="a", epoch=1)]


async def test_the_watcher_with_no_owners_topic_yet_is_caught_up_at_once():
    watcher = OwnerWatcher(Claims(), Consumer({"llmq.results"}, {}), "b")
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.caught_up.wait(), 5)
    watcher.stop()
    await task


class NoJobs:
    """A store whose every call fails the test: the driver must not look at jobs yet."""

    def __getattr__(self, name):
        raise AssertionError(f"the driver called store.{name} before the claims were read")


async def test_the_driver_drives_nothing_before_the_claims_were_read():
    watcher = OwnerWatcher(Claims(), Consumer(set(), {}), "b")
    driver = JobDriver(Settings(), NoJobs(), None, None, None, None, watcher)
    await driver.tick()  # no store call


def test_a_drivers_lease_token_names_its_router_and_is_unique_to_its_life():
    first = JobDriver(Settings(), None, None, None, None, None, holder="local-result-router-1")
    again = JobDriver(Settings(), None, None, None, None, None, holder="local-result-router-1")
    assert first.token.startswith("local-result-router-1/") and first.token != again.token

"""Kafka-direct results that finished in a peer region, from the mirrored ``<peer>.llmq.results`` topics.

MirrorMaker 2 copies each region's llmq.results into its peer (docs/operations/multi-region.md). Each Kafka-direct result found
there is stored here as a result finished here would be, and its request_id claimed with the result's mirrored
position, so a producer that re-sends the request to this region after losing its own gets the stored answer
replayed by the batcher (its path for a copy of a known id), never a second run. Results that reach this region
after the re-sent request (the replication lag) cannot stop it from running again here.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis
from redis.exceptions import RedisError

from llmq_core import constants, wire
from llmq_result_router.store import ResultStore

log = logging.getLogger(__name__)
RETRY_DELAY_S = 1.0
PEER_TOPICS_REFRESH_MS = 5000  # how soon a newly mirrored <peer>.llmq.results is noticed (consumer metadata age)


def peer_claim(result: wire.FinalResult, topic: str, partition: int, offset: int) -> str | None:
    """The request-copy claim (``<position> <fingerprint>``) a peer's result makes here, or None when it makes none:
    only a Kafka-direct request's first answer (HTTP requests never cross regions, batch-job lines settle in their
    ledger, and a replay is not an answer of its own). The fingerprint of the request's parameters is not in the
    result: the claim carries none, so a re-sent copy is answered whatever its parameters."""
    if not isinstance(result.reply_to, wire.KafkaReply) or result.request_copy:
        return None
    return f"{topic}/{partition}@{offset} "


class PeerResults:
    """Consumes every ``<peer>.llmq.results`` (a pattern: mirrored topics appear while this runs) in its own group;
    stores and claims what :func:`peer_claim` selects, at least once (both writes keep the first value)."""

    def __init__(self, consumer: AIOKafkaConsumer, results: ResultStore, redis: Redis, request_id_ttl_ms: int) -> None:
        self.consumer = consumer
        self.results = results
        self.redis = redis
        self.request_id_ttl_ms = request_id_ttl_ms
        self._stopping = asyncio.Event()

    def subscribe(self) -> None:
        self.consumer.subscribe(pattern=constants.PEER_RESULTS_PATTERN)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            batches = await self.consumer.getmany(timeout_ms=200, max_records=500)
            try:
                for records in batches.values():
                    for record in records:
                        await self._record(record)
                if batches:
                    await self.consumer.commit()
            except RedisError as exc:  # Redis restarting: take the same records again
                log.warning("recording peer results failed (%r); again in %.0f s", exc, RETRY_DELAY_S)
                await asyncio.sleep(RETRY_DELAY_S)
                for tp, records in batches.items():
                    self.consumer.seek(tp, records[0].offset)

    async def _record(self, record) -> None:
        try:
            result = wire.decode_record(record.value, record.headers)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # its region dead-lettered it already
            log.warning("peer result at %s[%d]@%d unreadable: %s", record.topic, record.partition, record.offset, exc)
            return
        if not isinstance(result, wire.FinalResult):
            return
        claim = peer_claim(result, record.topic, record.partition, record.offset)
        if claim is None:
            return
        await self.results.put(result.tenant_id, result.request_id, wire.encode(result))
        await self.redis.set(constants.request_copy_key(result.request_id), claim, nx=True, px=self.request_id_ttl_ms)

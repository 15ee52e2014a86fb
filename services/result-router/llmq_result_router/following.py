"""A group-less consumer that follows topics of this cluster until stopped (the owners topics, the peers' mirrored job
topics): mirrored topics appear while it runs, so which topics to follow is looked at again every
:data:`TOPICS_REFRESH_MS`; a failure is logged and the following starts again."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer

log = logging.getLogger(__name__)

TOPICS_REFRESH_MS = 5000  # how often new (mirrored) topics are looked for
POLL_MS = 500


class Follower:
    """Subclasses say which of the cluster's topics to follow (:meth:`_refresh`) and what one poll does
    (:meth:`_poll`, at most :data:`POLL_MS`)."""

    what = "topics"  # for the log

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer  # no group: every router reads everything it follows
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._follow()
            except Exception:
                log.exception("following the %s failed; again", self.what)
                await asyncio.sleep(POLL_MS / 1000)

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        refreshed = 0.0
        while not self._stopping.is_set():
            if loop.time() - refreshed >= TOPICS_REFRESH_MS / 1000:
                refreshed = loop.time()
                await self._refresh(await self.consumer.topics())
            await self._poll()

    async def _refresh(self, existing: set[str]) -> None:
        raise NotImplementedError

    async def _poll(self) -> None:
        raise NotImplementedError

"""Fakes shared by the result-router's unit tests."""

from __future__ import annotations

from llmq_core.kafka import is_valid_topic_name


class FakeRedis:
    """The few Redis calls the router's delivery path makes, in a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def set(self, key, value, px=None, nx=False):
        if nx and key in self.data:
            return None
        self.data[key] = value
        return True

    async def exists(self, key):
        return int(key in self.data)

    def register_script(self, script):
        async def put(keys, args):  # ResultStore's script, as far as these tests need it: SET NX of the result
            return [int(bool(await self.set(keys[0], args[0], nx=True))), 0]

        return put


class FakeConsumer:
    """Hands out ``records`` once (on partition ``tp``), then stops the router it feeds (set ``router``)."""

    def __init__(self, records, tp=("llmq.results", 0)) -> None:
        self.records, self.tp, self.commits, self.seeks, self.router = records, tp, 0, 0, None

    async def getmany(self, timeout_ms, max_records):
        if not self.records:
            self.router.stop()
            return {}
        batch, self.records = self.records, []
        return {self.tp: batch}

    def seek(self, tp, offset) -> None:
        self.seeks += 1

    async def commit(self) -> None:
        self.commits += 1


class FakeProducer:
    """Like aiokafka: records what was sent; a send to an illegal topic name never succeeds. ``topics``: those the
    cluster has (``list_topics``)."""

    def __init__(self, topics=frozenset()) -> None:
        self.topics = set(topics)
        self.sent: list[tuple[str, bytes]] = []

    async def partitions_for(self, topic):
        return {0}

    async def list_topics(self):
        return self.topics

    async def send_and_wait(self, topic, value, key=None, headers=None):
        if not is_valid_topic_name(topic):
            raise AssertionError(f"produced to illegal topic {topic!r}")
        self.sent.append((topic, key))

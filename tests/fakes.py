"""The fakes of Kafka and Redis clients every unit test shares: in memory, and only the calls llmq's code makes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from llmq_core import constants
from llmq_core.kafka import is_valid_topic_name


@dataclass
class Record:
    """A consumed Kafka record, as aiokafka hands it out."""

    offset: int
    value: bytes | None
    headers: tuple | list = ()
    key: bytes | None = None
    topic: str = constants.REQUEST_TOPICS[0]
    partition: int = 0


class FakeConsumer:
    """aiokafka's consumer. ``fetches``: what ``getmany`` returns, one per call ({partition: records}); once they are
    used up it returns nothing, after calling ``drained`` (set it, e.g. to the stop of the loop under test).
    ``seek(tp, offset)`` rewinds: the next fetch hands that partition's records from ``offset`` on again.
    ``commits``: the offsets of each commit (None: a commit of all that was fetched). ``assigned``: the assignment
    (``pause``/``resume`` as aiokafka's); ``positions`` and ``highwaters``: what the lag is computed from."""

    def __init__(self, *fetches: dict, assigned=()) -> None:
        self.fetches = list(fetches)
        self.drained: Callable[[], None] | None = None
        self.assigned = set(assigned)
        self.paused_tps: set = set()
        self.commits: list[dict | None] = []
        self.seeks: list[tuple] = []
        self.positions: dict = {}
        self.highwaters: dict = {}
        self._fetched: dict = {}
        self._rewound: dict = {}

    async def getmany(self, *tps, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if self._rewound:
            fetch, self._rewound = self._rewound, {}
        elif self.fetches:
            fetch = self.fetches.pop(0)
        else:
            if self.drained is not None:
                self.drained()
            return {}
        self._fetched = fetch
        return fetch

    def seek(self, tp, offset: int) -> None:
        self.seeks.append((tp, offset))
        self._rewound[tp] = [r for r in self._fetched.get(tp, ()) if r.offset >= offset]

    async def commit(self, offsets: dict | None = None) -> None:
        self.commits.append(None if offsets is None else dict(offsets))

    def assignment(self) -> set:
        return set(self.assigned)

    def paused(self) -> set:
        return set(self.paused_tps)

    def pause(self, *tps) -> None:
        self.paused_tps |= set(tps)

    def resume(self, *tps) -> None:
        self.paused_tps -= set(tps)

    def highwater(self, tp) -> int:
        return self.highwaters[tp]

    async def position(self, tp) -> int:
        return self.positions[tp]


class FakeCluster:
    """aiokafka's cluster metadata as a producer holds it: every topic has ``partitions`` ({0}) unless
    :meth:`update` changed it (None: the topic is missing), which calls the listeners as a metadata refresh does."""

    def __init__(self) -> None:
        self.partitions: dict[str, set[int] | None] = {}
        self._listeners: set = set()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic, {0})

    def add_listener(self, listener) -> None:
        self._listeners.add(listener)

    def remove_listener(self, listener) -> None:
        self._listeners.remove(listener)

    def update(self, topic: str, partitions: set[int] | None) -> None:
        self.partitions[topic] = partitions
        for listener in list(self._listeners):
            listener(self)


@dataclass
class FakeClient:
    """A producer's ``client`` (aiokafka's AIOKafkaClient): its ``cluster`` metadata."""

    cluster: FakeCluster


class FakeProducer:
    """aiokafka's producer: records what is sent in ``sent`` (and in ``log``, when given, as ("kafka", value), so a test
    sees the order of sends and Redis publishes). ``failing`` raises that error (True: a timeout) from every send;
    ``failures``: per record key, the errors its next sends raise, in order; values over ``max_value_bytes`` are refused
    as the broker refuses a record over its topic's max.message.bytes, and so is every record to ``refusing_topics``; a
    send to an illegal topic name never succeeds. ``topics``: those the cluster has (``list_topics``)."""

    def __init__(self, topics=frozenset(), *, log: list | None = None) -> None:
        self.topics = set(topics)
        self.log = log
        self.sent: list[dict] = []
        self.failing: bool | Exception = False
        self.failures: dict[str, list[Exception]] = {}
        self.max_value_bytes: int | None = None
        self.refusing_topics: set[str] = set()
        self.running = False
        self.client = FakeClient(FakeCluster())

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    async def partitions_for(self, topic: str) -> set[int]:
        return self.client.cluster.partitions_for_topic(topic)

    async def list_topics(self) -> set[str]:
        return self.topics

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None) -> None:
        if not is_valid_topic_name(topic):
            raise AssertionError(f"produced to illegal topic {topic!r}")
        if self.failing:
            raise KafkaTimeoutError() if self.failing is True else self.failing
        errors = self.failures.get(key.decode(), []) if key is not None else []
        if errors:
            raise errors.pop(0)
        too_large = self.max_value_bytes is not None and len(value) > self.max_value_bytes
        if too_large or topic in self.refusing_topics:
            raise MessageSizeTooLargeError()
        self.sent.append(dict(topic=topic, value=value, key=key, partition=partition, headers=headers))
        if self.log is not None:
            self.log.append(("kafka", value))

    async def send(self, topic, value, key=None, partition=None, headers=None):
        """aiokafka's two-step send: the errors of ``send_and_wait`` raise here; the ack is then always good."""
        await self.send_and_wait(topic, value, key=key, partition=partition, headers=headers)

        async def ack() -> None:
            return None

        return ack()

    def on(self, topic: str) -> list[dict]:
        return [s for s in self.sent if s["topic"] == topic]

    def keys(self) -> list[tuple[str, bytes | None]]:
        """(topic, key) of each record sent, in order."""
        return [(s["topic"], s["key"]) for s in self.sent]


class FakePipeline:
    """A non-transactional pipeline: commands are queued, and run in order by ``execute``."""

    def __init__(self, redis: FakeRedis) -> None:
        self.redis = redis
        self.queued: list = []

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc) -> bool:
        return False

    def __getattr__(self, name: str):
        command = getattr(self.redis, name)
        return lambda *args, **kwargs: self.queued.append(command(*args, **kwargs))

    async def execute(self) -> list:
        queued, self.queued = self.queued, []
        return [await command for command in queued]


def _bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else value


class FakeRedis:
    """In memory, the Redis calls llmq's services make (no expiry). Published messages go to ``published`` (and to
    ``log``, when given, as ("redis", data)). Scripts: the idempotency release compares and deletes; the router's
    claim takeover compares and sets; the result store's put is a SET NX of the result, with no bound; the rate limiter's take answers ``take_reply`` ({1, 0, 0}:
    granted) and records its keys and args in ``takes``, its refund in ``gives``."""

    def __init__(self, *, log: list | None = None) -> None:
        self.log = log
        self.published: list[tuple[str, bytes]] = []
        self.data: dict[str, bytes] = {}
        self.hashes: dict[str, dict[bytes, bytes | int]] = {}
        self.lists: dict[str, list[bytes]] = {}
        self.take_reply = [1, 0, 0]
        self.takes: list[tuple[list, list]] = []
        self.gives: list[tuple[list, list]] = []

    async def publish(self, channel: str, data: bytes) -> int:
        self.published.append((channel, data))
        if self.log is not None:
            self.log.append(("redis", data))
        return 0

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self.data.get(key) for key in keys]

    async def exists(self, key: str) -> int:
        return int(key in self.data)

    async def set(self, key: str, value, nx: bool = False, get: bool = False, px: int | None = None):
        old = self.data.get(key)
        if not (nx and old is not None):
            self.data[key] = _bytes(value)
        if get:
            return old
        return None if nx and old is not None else True

    async def hgetall(self, key: str) -> dict[bytes, bytes | int]:
        return dict(self.hashes.get(key, {}))

    async def hset(self, key: str, field=None, value=None, mapping: dict | None = None) -> int:
        fields = self.hashes.setdefault(key, {})
        updates = {_bytes(f): v for f, v in (mapping or {field: value}).items()}
        new = sum(f not in fields for f in updates)
        fields.update(updates)
        return new

    async def hincrby(self, key: str, field, amount: int) -> int:
        fields = self.hashes.setdefault(key, {})
        fields[_bytes(field)] = fields.get(_bytes(field), 0) + amount
        return fields[_bytes(field)]

    async def pexpire(self, key: str, ms: int) -> int:
        return int(key in self.data or key in self.hashes or key in self.lists)  # no expiry here

    async def rpush(self, key: str, *values: bytes) -> int:
        self.lists.setdefault(key, []).extend(values)
        return len(self.lists[key])

    async def lrange(self, key: str, start: int, end: int) -> list[bytes]:
        values = self.lists.get(key, [])
        return values[start : None if end == -1 else end + 1]

    async def hdel(self, key: str, *fields: bytes) -> int:
        return sum(self.hashes.get(key, {}).pop(f, None) is not None for f in fields)

    def pipeline(self, transaction: bool = False) -> FakePipeline:
        return FakePipeline(self)

    def register_script(self, script: str):
        async def run(keys: list, args: list):
            if "cjson" in script:  # release: delete while the claim names this request
                claim = self.data.get(keys[0])
                if claim and msgspec.json.decode(claim)["request_id"] == args[0]:
                    del self.data[keys[0]]
                    return 1
                return 0
            if "ZPOPMIN" in script:  # the result-router's ResultStore.put: first stored wins, no bound
                return [int(bool(await self.set(keys[0], args[0], nx=True))), 0]
            if "claim takeover" in script:  # the result-router's reply claim: compare and set
                if self.data.get(keys[0]) == _bytes(args[0]):
                    self.data[keys[0]] = _bytes(args[1])
                    return 1
                return 0
            if "amount" in script:  # the rate limiter's refund
                self.gives.append((keys, args))
                return 1
            self.takes.append((keys, args))
            return list(self.take_reply)

        return run

"""ReplyListener: replies reach waiters, heartbeats the catalog; a (re)subscription recovers stored results."""

import pytest
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.asyncio import Redis

from llmq_api.catalog import ModelCatalog
from llmq_api.metrics import ApiMetrics
from llmq_api.pod import ReplyListener, replies_connection
from llmq_api.waiters import WaiterRegistry
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from tests.builders import heartbeat
from tests.unit.api.fakes import final


class StoredResults:
    def __init__(self, stored: dict[str, bytes]) -> None:
        self.stored = stored

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self.stored.get(key) for key in keys]


def make(stored=None):
    registry = WaiterRegistry(10)
    catalog = ModelCatalog(FakeClock())
    metrics = ApiMetrics(lambda: len(registry))
    listener = ReplyListener(StoredResults(stored or {}), "pod-1", registry, catalog, metrics)
    return listener, registry, catalog, metrics


async def test_replies_go_to_waiters_and_strays_are_counted():
    listener, registry, _, metrics = make()
    waiter = registry.register("r1", stream=False)
    channel = constants.replies_channel("pod-1")
    listener.deliver(channel, wire.encode(final("r1")))
    listener.deliver(channel, wire.encode(final("someone-else")))
    listener.deliver(channel, b"\xc1 not msgpack")
    assert waiter.resolution.request_id == "r1"
    assert metrics.registry.get_sample_value("llmq_api_dropped_replies_total") == 1


async def test_heartbeats_teach_the_catalog():
    listener, _, catalog, _ = make()
    beat = heartbeat("big-model", partition=3, context_window=4096)
    listener.deliver(constants.REDIS_HEARTBEATS_CHANNEL, wire.encode(beat))
    assert catalog.context_windows()["big-model"] == 4096


async def test_subscription_confirmation_recovers_results_stored_meanwhile():
    listener, registry, _, _ = make({constants.result_key("r1"): wire.encode(final("r1", "recovered"))})
    waiter = registry.register("r1", stream=False)
    other = registry.register("r2", stream=False)
    await listener._handle([b"subscribe", constants.replies_channel("pod-1").encode(), 1])
    assert listener.subscribed
    assert waiter.resolution.choices[0].text == "recovered" and other.resolution is None


class QuietConnection:
    """A replies connection whose reads return what the test queued, else None (a quiet poll)."""

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.sent, self.reads, self.disconnected = kwargs, [], [], False

    async def connect(self) -> None: ...

    async def send_command(self, *args, check_health=True) -> None:
        self.sent.append(args)

    async def read_response(self, timeout, disconnect_on_error=True):
        return self.reads.pop(0) if self.reads else None

    async def disconnect(self) -> None:
        self.disconnected = True


class OwnConnections(StoredResults):
    def __init__(self, reads: list) -> None:
        super().__init__({})
        self.made: list[QuietConnection] = []
        self.reads = reads
        pool = self

        class Pool:
            connection_kwargs = {"host": "redis", "protocol": 3}

            @staticmethod
            def connection_class(**kwargs):
                connection = QuietConnection(**kwargs)
                connection.reads = list(pool.reads)
                pool.made.append(connection)
                return connection

        self.connection_pool = Pool


async def test_the_replies_connection_is_pinged_when_quiet_and_dropped_when_a_ping_goes_unanswered():
    channel = constants.replies_channel("pod-1").encode()
    beat = [b"message", constants.REDIS_HEARTBEATS_CHANNEL.encode(), wire.encode(heartbeat("m", partition=0))]
    redis = OwnConnections([[b"subscribe", channel, 1], None, beat, None, [b"pong", b""], None])
    registry = WaiterRegistry(10)
    listener = ReplyListener(redis, "pod-1", registry, ModelCatalog(FakeClock()), ApiMetrics(lambda: 0))
    with pytest.raises(ConnectionError, match="no PING"):
        await listener._listen()
    (connection,) = redis.made
    assert connection.kwargs["protocol"] == 2 and connection.kwargs["health_check_interval"] == 0
    subscribe = ("SUBSCRIBE", constants.replies_channel("pod-1"), constants.REDIS_HEARTBEATS_CHANNEL)
    # quiet -> PING; a heartbeat, quiet -> PING; the PONG, quiet -> PING; quiet again: dead
    assert connection.sent == [subscribe, ("PING",), ("PING",), ("PING",)]
    assert connection.disconnected and not listener.subscribed


def test_the_replies_connection_is_resp2_without_health_checks_with_either_parser():
    """redis-py refuses maintenance notifications on a RESP2 connection parsing in Python (no hiredis installed)."""
    for parser in (_AsyncRESP2Parser, _AsyncHiredisParser):
        client = Redis.from_url("redis://127.0.0.1:1/0", parser_class=parser, health_check_interval=5)
        connection = replies_connection(client.connection_pool)  # as the pod builds its client: RESP3 by default
        assert connection.protocol == 2 and connection.health_check_interval == 0
        assert isinstance(connection._parser, parser)

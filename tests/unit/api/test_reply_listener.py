"""ReplyListener: replies reach waiters, heartbeats the catalog; a (re)subscription recovers stored results."""

from llmq_api.catalog import ModelCatalog
from llmq_api.metrics import ApiMetrics
from llmq_api.pod import ReplyListener
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
    await listener._handle({"type": "subscribe", "channel": constants.replies_channel("pod-1").encode(), "data": 1})
    assert listener.subscribed
    assert waiter.resolution.choices[0].text == "recovered" and other.resolution is None

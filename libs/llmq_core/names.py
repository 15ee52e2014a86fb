"""The topics, channels and Redis keys a service's loops use, as one value: llmq's own by default.

Every loop takes a :class:`Names` (``names=``) instead of reading the constants itself, so a test (or a second stack
on a shared broker) runs it on private ones by passing ``Names(batches_topic=..., ...)``: one way to override names.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmq_core import constants
from llmq_core.kafka import reply_topic_prefixes
from llmq_core.settings import Settings


@dataclass(frozen=True, slots=True)
class Names:
    request_topics: tuple[str, ...] = constants.REQUEST_TOPICS
    deferred_topic: str = constants.requests_topic(constants.DEFERRED)
    batches_topic: str = constants.TOPIC_BATCHES
    results_topic: str = constants.TOPIC_RESULTS
    dead_letters_topic: str = constants.TOPIC_DEAD_LETTERS
    heartbeats_channel: str = constants.REDIS_HEARTBEATS_CHANNEL
    cancels_channel: str = constants.REDIS_CANCELS_CHANNEL
    stats_key: str = constants.STATS_BATCHER
    saturation_key: str = constants.REDIS_SATURATION_KEY
    capacity_prefix: str = constants.REDIS_CAPACITY_PREFIX
    reply_topic_prefixes: tuple[str, ...] = ()  # Settings.kafka.reply_topic_prefixes: see kafka.reply_topic_error

    def capacity_keys(self, worker_id: str) -> tuple[str, str]:
        """A worker's capacity ledger and its grants (``constants.REDIS_CAPACITY_PREFIX``)."""
        return f"{self.capacity_prefix}{worker_id}", f"{self.capacity_prefix}{worker_id}:grants"

    def request_topic(self, traffic_class: str) -> str:
        """The request topic of ``traffic_class`` (``request_topics`` are in ``constants.TRAFFIC_CLASSES``' order)."""
        return self.request_topics[constants.TRAFFIC_CLASSES.index(traffic_class)]

    @classmethod
    def from_settings(cls, settings: Settings) -> Names:
        """llmq's names, with the reply-topic prefixes ``settings`` allow."""
        return cls(reply_topic_prefixes=reply_topic_prefixes(settings))

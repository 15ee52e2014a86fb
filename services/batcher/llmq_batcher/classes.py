"""The priority classes the batcher queues by: their precedence (a queue's index) and the class of a request."""

from __future__ import annotations

from llmq_core import constants, wire

CLASS_KEYS = constants.PRIORITY_CLASSES  # queue index = position here: interactive:paid first, deferred last
DEFERRED = CLASS_KEYS.index(constants.DEFERRED)
_PRIORITY = {
    (c, tier): constants.priority_class(c, tier) for c in constants.TRAFFIC_CLASSES for tier in constants.TIERS
}
_CLASS_INDEX = {pair: CLASS_KEYS.index(key) for pair, key in _PRIORITY.items()}  # (traffic class, tier) -> index
TRAFFIC_CLASS = {key: c for (c, _), key in _PRIORITY.items()}  # CLASS_KEYS entry -> traffic class (its wait bound)


def class_index(request: wire.GenerationRequest) -> int:
    """Index into CLASS_KEYS of a request (tier matters only for interactive traffic)."""
    return _CLASS_INDEX[(request.traffic_class, request.tier)]

"""Forged replies on a pod's Redis channel (issue 16, item 3): a pod takes a reply only for a request it holds and for
the tenant it holds it for; a forgery is dropped and counted, and the real reply still resolves the request."""

from __future__ import annotations

import msgspec

from llmq_api.waiters import Dispatched, WaiterRegistry
from llmq_core import constants, wire
from tests.unit.api.fakes import chunk, final
from tests.unit.api.test_reply_listener import make

CHANNEL = constants.replies_channel("pod-1")


def forged_count(metrics) -> float:
    return metrics.registry.get_sample_value("llmq_api_forged_replies_total")


def test_a_result_naming_another_tenant_is_a_forgery_and_leaves_the_waiter_open():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=False, tenant_id="acme")
    assert registry.dispatch(final("r1", "forged", tenant_id="mallory")) is Dispatched.FORGED
    assert waiter.resolution is None and registry.forged == 1 and "r1" in registry
    assert registry.dispatch(final("r1", "real", tenant_id="acme")) is Dispatched.DELIVERED
    assert waiter.resolution.choices[0].text == "real"


def test_a_chunk_naming_another_tenant_is_a_forgery_and_the_stream_goes_on():
    registry = WaiterRegistry(10)
    waiter = registry.register("r1", stream=True, tenant_id="acme")
    own = msgspec.structs.replace(chunk("r1", "a", 0), tenant_id="acme")
    assert registry.dispatch(chunk("r1", "X", 0)) is Dispatched.FORGED  # naming no tenant: a forgery too
    assert registry.dispatch(msgspec.structs.replace(own, tenant_id="mallory", text="X")) is Dispatched.FORGED
    assert registry.dispatch(own) is Dispatched.DELIVERED
    assert waiter._events.get_nowait().text == "a"


def test_a_reply_for_a_request_not_held_here_is_dropped_not_forged():
    registry = WaiterRegistry(10)
    assert registry.dispatch(final("r9", tenant_id="mallory")) is Dispatched.DROPPED
    assert (registry.dropped, registry.forged) == (1, 0)


async def test_the_listener_counts_forgeries_apart_from_strays_and_delivers_the_real_answer():
    listener, registry, _, metrics = make()
    waiter = registry.register("r1", stream=False, tenant_id="acme")
    listener.deliver(CHANNEL, wire.encode(final("r1", "forged", tenant_id="mallory")))
    listener.deliver(CHANNEL, wire.encode(final("r1", "real", tenant_id="acme")))
    assert waiter.resolution.choices[0].text == "real"
    assert forged_count(metrics) == 1
    assert metrics.registry.get_sample_value("llmq_api_dropped_replies_total") == 0

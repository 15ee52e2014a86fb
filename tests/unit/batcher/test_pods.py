"""PodWatch (which API pods are gone) and BatchPolicy.requests_by_pod (whose work is held here)."""

from __future__ import annotations

import msgspec

from llmq_batcher.pods import PodWatch
from llmq_core import wire
from tests.unit.batcher.helpers import T0, hb, make_policy, req


def test_a_pod_is_gone_only_after_its_key_was_missing_for_the_grace():
    watch = PodWatch(grace_ms=1000)
    assert watch.observe({"a": False, "b": True}, T0) == []
    assert watch.observe({"a": False, "b": True}, T0 + 999) == []
    assert watch.observe({"a": False, "b": True}, T0 + 1000) == ["a"]
    assert watch.observe({"a": False, "b": False}, T0 + 1500) == ["a"]


def test_a_key_seen_again_within_the_grace_keeps_the_pod_alive():  # e.g. Redis restarted, pods set their keys again
    watch = PodWatch(grace_ms=1000)
    watch.observe({"a": False}, T0)
    watch.observe({"a": True}, T0 + 500)
    assert watch.observe({"a": False}, T0 + 1200) == []
    assert watch.observe({"a": False}, T0 + 2200) == ["a"]


def test_pods_without_work_here_are_forgotten():
    watch = PodWatch(grace_ms=1000)
    watch.observe({"a": False}, T0)
    watch.observe({}, T0 + 500)
    assert watch.observe({"a": False}, T0 + 1200) == []


def test_requests_by_pod_lists_queued_and_dispatched_http_requests_only():
    policy, _ = make_policy()
    policy.add(req("first"), T0)
    other = msgspec.structs.replace(req("other-pod"), reply_to=wire.HttpReply(instance_id="pod-2"))
    policy.add(other, T0)
    policy.add(msgspec.structs.replace(req("kafka"), reply_to=wire.KafkaReply(topic="t")), T0)
    policy.on_heartbeat(hb(free=1, max_slots=1), T0)
    dispatched = policy.schedule(T0).batches
    assert len(dispatched) == 1
    assert {k: sorted(v) for k, v in policy.requests_by_pod().items()} == {"pod-1": ["first"], "pod-2": ["other-pod"]}

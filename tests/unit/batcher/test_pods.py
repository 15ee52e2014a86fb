"""PodWatch (which API pods are gone) and BatchPolicy.requests_by_pod (whose work is held here)."""

from __future__ import annotations

import msgspec

from llmq_batcher.pods import HeldWork, PodWatch, by_holder
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
    held = {pod: sorted(r.request_id for r in requests) for pod, requests in policy.requests_by_pod().items()}
    assert held == {"pod-1": ["first"], "pod-2": ["other-pod"]}


def stream(request_id: str, pod: str, key: str | None = "k") -> wire.GenerationRequest:
    return msgspec.structs.replace(
        req(request_id), stream=True, idempotency_key=key, reply_to=wire.HttpReply(instance_id=pod)
    )


def test_a_resumable_stream_is_held_by_the_pod_that_last_resumed_it():
    held = {
        "pod-1": [
            req("plain"),
            stream("kept", "pod-1"),
            stream("moved", "pod-1"),
            stream("keyless", "pod-1", key=None),
        ],
        "pod-2": [stream("other", "pod-2")],
    }
    holders = {"kept": None, "moved": b"pod-3 token", "other": b"garbled"}
    assert by_holder(held, holders) == {
        "pod-1": (["plain", "keyless"], ["kept"]),  # a stream without an Idempotency-Key is plain: no one can resume it
        "pod-3": ([], ["moved"]),
        "pod-2": ([], ["other"]),  # a value naming no pod: its first pod still holds it
    }


def test_a_resumable_stream_is_cancelled_only_once_its_holder_was_gone_for_the_resume_window_too():
    held = HeldWork(grace_ms=1000, resume_window_ms=5000)
    work = {"pod-1": (["plain"], ["stream"])}
    assert held.gone(work, {"pod-1": False}, T0) == []
    assert held.gone(work, {"pod-1": False}, T0 + 1000) == [("pod-1", ["plain"])]
    assert held.gone(work, {"pod-1": False}, T0 + 5999) == [("pod-1", ["plain"])]
    assert held.gone(work, {"pod-1": False}, T0 + 6000) == [("pod-1", ["plain"]), ("pod-1", ["stream"])]


def test_a_stream_resumed_at_a_live_pod_within_the_window_is_not_cancelled():
    held = HeldWork(grace_ms=1000, resume_window_ms=5000)
    held.gone({"pod-1": ([], ["stream"])}, {"pod-1": False}, T0)
    assert held.gone({"pod-2": ([], ["stream"])}, {"pod-2": True}, T0 + 3000) == []  # pod-2 resumed it
    assert held.gone({"pod-2": ([], ["stream"])}, {"pod-2": True}, T0 + 9000) == []
    assert held.gone({"pod-2": ([], ["stream"])}, {"pod-2": False}, T0 + 10_000) == []  # now pod-2 goes: a new window
    assert held.gone({"pod-2": ([], ["stream"])}, {"pod-2": False}, T0 + 16_000) == [("pod-2", ["stream"])]

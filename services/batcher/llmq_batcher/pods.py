"""Which API pods are gone, from their liveness keys: the work they wait for has nobody waiting any more.

Each pod SETs ``pod_key(instance_id)`` every ``pod_heartbeat_interval_ms`` with PX ``pod_heartbeat_ttl_ms``. A pod is
gone once its key was missing on every check over ``grace_ms``: a Redis restart (every key lost, set again within one
heartbeat) or one late heartbeat does not make a pod gone.

A resumable stream (``llmq_core.stream_log``) is watched under the pod that holds it (the pod that last resumed it, or
its first) and cancelled only once that pod was gone for the resume window too: a client may resume it at another pod.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmq_core import wire
from llmq_core.stream_log import holder_pod, resumable


class PodWatch:
    """Pure bookkeeping over checks of pod keys; times in epoch ms."""

    def __init__(self, grace_ms: int) -> None:
        self.grace_ms = grace_ms
        self._missing_since: dict[str, int] = {}

    def observe(self, seen: dict[str, bool], now_ms: int) -> list[str]:
        """Take one check, ``{instance_id: its key exists}``; returns the pods gone as of ``now_ms``.

        Pods not in ``seen`` are forgotten (memory stays bounded by the pods that hold work here).
        """
        gone = []
        for pod, alive in seen.items():
            if alive:
                self._missing_since.pop(pod, None)
            elif now_ms - self._missing_since.setdefault(pod, now_ms) >= self.grace_ms:
                gone.append(pod)
        for pod in [p for p in self._missing_since if p not in seen]:
            del self._missing_since[pod]
        return gone


def by_holder(
    held: Mapping[str, list[wire.GenerationRequest]], holders: Mapping[str, bytes | None]
) -> dict[str, tuple[list[str], list[str]]]:
    """Pod -> (ids of its plain requests, ids of the resumable streams it holds), from ``held`` (pod waiting ->
    requests) and ``holders`` (request_id -> the value of its stream holder key; a resumable stream missing there, or
    naming no pod, stays with the pod it was sent from)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for pod, requests in held.items():
        for request in requests:
            if resumable(request):
                holder = holder_pod(holders.get(request.request_id)) or pod
                out.setdefault(holder, ([], []))[1].append(request.request_id)
            else:
                out.setdefault(pod, ([], []))[0].append(request.request_id)
    return out


class HeldWork:
    """Which held requests to cancel for their pods being gone (pure; times in epoch ms): a plain request once its pod
    was gone for ``grace_ms``, a resumable stream once its holder was gone for ``grace_ms + resume_window_ms``."""

    def __init__(self, grace_ms: int, resume_window_ms: int) -> None:
        self._plain = PodWatch(grace_ms)
        self._streams = PodWatch(grace_ms + resume_window_ms)

    def gone(
        self, work: Mapping[str, tuple[list[str], list[str]]], alive: Mapping[str, bool], now_ms: int
    ) -> list[tuple[str, list[str]]]:
        """(pod, the ids of its requests to cancel) from one check: ``work`` as :func:`by_holder` gives it, ``alive``:
        whether each of its pods' keys exists."""
        plain = {pod: alive[pod] for pod, (ids, _) in work.items() if ids}
        streams = {pod: alive[pod] for pod, (_, ids) in work.items() if ids}
        out = [(pod, work[pod][0]) for pod in self._plain.observe(plain, now_ms)]
        return out + [(pod, work[pod][1]) for pod in self._streams.observe(streams, now_ms)]

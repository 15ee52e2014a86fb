"""Which API pods are gone, from their liveness keys: the work they wait for has nobody waiting any more.

Each pod SETs ``pod_key(instance_id)`` every ``pod_heartbeat_interval_ms`` with PX ``pod_heartbeat_ttl_ms``. A pod is
gone once its key was missing on every check over ``grace_ms``: a Redis restart (every key lost, set again within one
heartbeat) or one late heartbeat does not make a pod gone.
"""

from __future__ import annotations


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

"""Admission control (pure): shed a new request with a 429 before it costs anything when its class is overloaded.

Inputs: the batchers' saturation reports (queue depth and oldest queued age per ``PRIORITY_CLASSES`` entry) and this
pod's in-flight count. A new request of class c waits behind every queued request of c and of the classes more
important than c, so its predicted queue wait is the oldest queued age among those classes. Class c is shed when

- that predicted wait exceeds ``api_shed_wait_ms[c]``, or
- the requests queued in c and above fill ``api_shed_share[c]`` of ``batcher_max_queued``, or
- this pod's in-flight requests fill ``api_shed_share[c]`` of ``api_max_in_flight``.

Both thresholds fall with priority (settings' defaults), so the lowest class is always shed first. The answer's
``Retry-After`` is the predicted wait in whole seconds (1 to :data:`MAX_RETRY_AFTER_S`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmq_core import wire
from llmq_core.constants import HTTP_RETRY_AFTER, PRIORITY_CLASSES
from llmq_core.settings import Settings
from llmq_api.errors import RATE_LIMIT_ERROR, ApiError

MAX_RETRY_AFTER_S = 60
RATE_LIMIT_CODE = "rate_limit_exceeded"


@dataclass(frozen=True, slots=True)
class Saturation:
    """The batchers' queues merged per PRIORITY_CLASSES entry: requests queued (sum), oldest queued age (ms, max)."""

    depth: Mapping[str, int]
    oldest_age_ms: Mapping[str, int]

    def ahead(self, priority_class: str) -> tuple[int, int]:
        """(requests queued, oldest queued age in ms) over ``priority_class`` and every class above it."""
        classes = PRIORITY_CLASSES[:PRIORITY_CLASSES.index(priority_class) + 1]
        return (sum(self.depth.get(c, 0) for c in classes),
                max((self.oldest_age_ms.get(c, 0) for c in classes), default=0))


IDLE = Saturation({}, {})


def merge_reports(reports: Iterable[wire.BatcherSaturation], now_ms: int, stale_ms: int) -> Saturation:
    """Merge the reports sent within ``stale_ms`` of ``now_ms``; a queue's oldest request has aged since its report."""
    depth: dict[str, int] = {}
    oldest: dict[str, int] = {}
    for report in reports:
        since_ms = now_ms - report.sent_ms
        if since_ms > stale_ms:
            continue
        for name, load in report.classes.items():
            depth[name] = depth.get(name, 0) + load.depth
            if load.depth:
                oldest[name] = max(oldest.get(name, 0), load.oldest_age_ms + max(since_ms, 0))
    return Saturation(depth, oldest)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused (metrics label) and the client's error."""

    reason: str
    error: ApiError


def too_many_requests(message: str, retry_after_s: int, type: str = RATE_LIMIT_ERROR) -> ApiError:
    """A 429 ``rate_limit_exceeded`` with an integer ``Retry-After`` (seconds)."""
    return ApiError(429, message, type=type, code=RATE_LIMIT_CODE, headers={HTTP_RETRY_AFTER: str(retry_after_s)})


def retry_after_s(wait_ms: int) -> int:
    """A predicted wait as a Retry-After value: whole seconds, rounded up, within 1..MAX_RETRY_AFTER_S."""
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait_ms / 1000)))


@dataclass(frozen=True, slots=True)
class ShedPolicy:
    """Thresholds per PRIORITY_CLASSES entry: predicted wait (ms) and share of the pod's / batchers' capacity."""

    wait_ms: Mapping[str, int]
    share: Mapping[str, float]
    max_in_flight: int
    max_queued: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ShedPolicy:
        return cls(wait_ms=dict(settings.api_shed_wait_ms), share=dict(settings.api_shed_share),
                   max_in_flight=settings.api_max_in_flight, max_queued=settings.batcher_max_queued)

    def check(self, priority_class: str, saturation: Saturation, in_flight: int) -> Rejection | None:
        """None to admit a request of ``priority_class``; otherwise the Rejection (a 429)."""
        queued, wait_ms = saturation.ahead(priority_class)
        share = self.share.get(priority_class, 1.0)
        limit_ms = self.wait_ms.get(priority_class)
        if limit_ms is not None and wait_ms > limit_ms:
            reason = "queue_wait"
        elif queued >= share * self.max_queued:
            reason = "queue_depth"
        elif in_flight >= share * self.max_in_flight:
            reason = "pod_in_flight"
        else:
            return None
        message = (f"The service is overloaded for {priority_class} requests (predicted queue wait "
                   f"{wait_ms} ms); retry after the Retry-After delay")
        return Rejection(reason, too_many_requests(message, retry_after_s(wait_ms)))

"""Admission control (pure): refuse a new request before it costs anything when its model's class is overloaded or
its model has no worker.

Inputs: the batchers' saturation reports, per model (queue depth and oldest queued age per ``PRIORITY_CLASSES`` entry,
live workers, last worker heartbeat), and this pod's in-flight count. A new request of class c for model m waits behind
every queued request of m in c and in the classes more important than c, so its predicted queue wait is the oldest
queued age among those queues; other models' queues do not delay it and never shed it. Class c of model m is shed (429)
when

- that predicted wait exceeds ``api_shed_wait_ms[c]`` (not for deferred work of a model without workers: it waits for
  them, so that an autoscaler scaling the model from zero sees its queue), or
- the requests of m queued in c and above fill ``api_shed_share[c]`` of ``batcher_max_queued``, or
- this pod's in-flight requests fill ``api_shed_share[c]`` of ``api_max_in_flight``.

Both thresholds fall with priority (settings' defaults), so the lowest class is always shed first. The answer's
``Retry-After`` is the predicted wait in whole seconds (1 to :data:`MAX_RETRY_AFTER_S`).

A model whose workers have all been gone for longer than ``worker_heartbeat_timeout_ms`` (or that no batcher has seen a
worker of since it started, that long ago) answers interactive and near_interactive requests (a person waits for
both) with 503 ``model_unavailable`` at once; deferred requests still queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmq_core import wire
from llmq_core.constants import DEFERRED, HTTP_RETRY_AFTER, PRIORITY_CLASSES
from llmq_core.settings import Settings
from llmq_api.errors import RATE_LIMIT_ERROR, SERVER_ERROR, ApiError

MAX_RETRY_AFTER_S = 60
RATE_LIMIT_CODE = "rate_limit_exceeded"
MODEL_UNAVAILABLE_CODE = "model_unavailable"


@dataclass(frozen=True, slots=True)
class Queues:
    """One model's queues merged over the batchers per PRIORITY_CLASSES entry: requests queued (sum), oldest queued
    age (ms, max)."""

    depth: Mapping[str, int]
    oldest_age_ms: Mapping[str, int]

    def ahead(self, priority_class: str) -> tuple[int, int]:
        """(requests queued, oldest queued age in ms) over ``priority_class`` and every class above it."""
        classes = PRIORITY_CLASSES[:PRIORITY_CLASSES.index(priority_class) + 1]
        return (sum(self.depth.get(c, 0) for c in classes),
                max((self.oldest_age_ms.get(c, 0) for c in classes), default=0))


EMPTY = Queues({}, {})


@dataclass(frozen=True, slots=True)
class Saturation:
    """The fresh reports merged at ``as_of_ms``: queues per model; live workers per model (the most any batcher
    sees: they all hear the same heartbeats); the newest heartbeat of each model's workers; and since when the
    batchers have been watching (the earliest start among them; None without a fresh report, when nothing is known)."""

    queues: Mapping[str, Queues] = field(default_factory=dict)
    workers: Mapping[str, int] = field(default_factory=dict)
    worker_seen_ms: Mapping[str, int] = field(default_factory=dict)
    watching_since_ms: int | None = None
    as_of_ms: int = 0

    def ahead(self, model: str, priority_class: str) -> tuple[int, int]:
        """(requests of ``model`` queued, their oldest queued age in ms) over ``priority_class`` and the classes above."""
        return self.queues.get(model, EMPTY).ahead(priority_class)

    def worker_gone_ms(self, model: str) -> int | None:
        """How long ``model`` has been without a live worker (ms); None while it has one or nothing is known."""
        if self.watching_since_ms is None or self.workers.get(model):
            return None
        return self.as_of_ms - (self.worker_seen_ms.get(model) or self.watching_since_ms)


IDLE = Saturation()


def merge_reports(reports: Iterable[wire.BatcherSaturation], now_ms: int, stale_ms: int,
                  heard_ms: Mapping[str, int] | None = None) -> Saturation:
    """Merge the reports sent within ``stale_ms`` of ``now_ms``; a queue's oldest request has aged since its report.
    ``heard_ms``: model -> the last worker heartbeat this pod heard itself, which knows of a new worker up to a report
    interval sooner than the batchers' reports do."""
    depth: dict[str, dict[str, int]] = {}
    oldest: dict[str, dict[str, int]] = {}
    workers: dict[str, int] = {}
    seen: dict[str, int] = dict(heard_ms or {})
    starts = []
    for report in reports:
        since_ms = now_ms - report.sent_ms
        if since_ms > stale_ms:
            continue
        if report.started_ms:
            starts.append(report.started_ms)
        for model, load in report.models.items():
            workers[model] = max(workers.get(model, 0), load.workers)
            seen[model] = max(seen.get(model, 0), load.worker_seen_ms)
            _add_queues(load.classes, since_ms, depth.setdefault(model, {}), oldest.setdefault(model, {}))
    return Saturation({m: Queues(depth[m], oldest[m]) for m in depth}, workers, seen, min(starts, default=None),
                      now_ms)


def _add_queues(classes: Mapping[str, wire.QueueLoad], since_ms: int, depth: dict[str, int],
                oldest: dict[str, int]) -> None:
    for name, load in classes.items():
        depth[name] = depth.get(name, 0) + load.depth
        if load.depth:
            oldest[name] = max(oldest.get(name, 0), load.oldest_age_ms + max(since_ms, 0))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused (metrics label) and the client's error."""

    reason: str
    error: ApiError


def too_many_requests(message: str, retry_after_s: int, type: str = RATE_LIMIT_ERROR) -> ApiError:
    """A 429 ``rate_limit_exceeded`` with an integer ``Retry-After`` (seconds)."""
    return ApiError(429, message, type=type, code=RATE_LIMIT_CODE, headers={HTTP_RETRY_AFTER: str(retry_after_s)})


def model_unavailable(model: str, retry_after: int) -> ApiError:
    """A 503 ``model_unavailable``: no worker serves ``model`` now."""
    return ApiError(503, f"The model '{model}' has no running worker right now; retry after the Retry-After delay, "
                    "or send the request as deferred work (x-llmq-class: deferred), which waits for a worker",
                    type=SERVER_ERROR, param="model", code=MODEL_UNAVAILABLE_CODE,
                    headers={HTTP_RETRY_AFTER: str(retry_after)})


def retry_after_s(wait_ms: int) -> int:
    """A predicted wait as a Retry-After value: whole seconds, rounded up, within 1..MAX_RETRY_AFTER_S."""
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait_ms / 1000)))


@dataclass(frozen=True, slots=True)
class ShedPolicy:
    """Thresholds per PRIORITY_CLASSES entry: predicted wait (ms) and share of the pod's / batchers' capacity; a model
    without a live worker for longer than ``worker_timeout_ms`` is unavailable."""

    wait_ms: Mapping[str, int]
    share: Mapping[str, float]
    max_in_flight: int
    max_queued: int
    worker_timeout_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ShedPolicy:
        return cls(wait_ms=dict(settings.api_shed_wait_ms), share=dict(settings.api_shed_share),
                   max_in_flight=settings.api_max_in_flight, max_queued=settings.batcher_max_queued,
                   worker_timeout_ms=settings.worker_heartbeat_timeout_ms)

    def check(self, priority_class: str, model: str, saturation: Saturation, in_flight: int) -> Rejection | None:
        """None to admit a request of ``priority_class`` for ``model``; otherwise the Rejection (a 429 or a 503)."""
        gone_ms = saturation.worker_gone_ms(model)
        gone = gone_ms is not None and gone_ms > self.worker_timeout_ms
        if gone and priority_class != DEFERRED:
            return Rejection(MODEL_UNAVAILABLE_CODE, model_unavailable(model, retry_after_s(self.worker_timeout_ms)))
        queued, wait_ms = saturation.ahead(model, priority_class)
        share = self.share.get(priority_class, 1.0)
        limit_ms = self.wait_ms.get(priority_class)
        if limit_ms is not None and wait_ms > limit_ms and not gone:
            reason = "queue_wait"
        elif queued >= share * self.max_queued:
            reason = "queue_depth"
        elif in_flight >= share * self.max_in_flight:
            reason = "pod_in_flight"
        else:
            return None
        message = (f"The service is overloaded for {priority_class} requests of {model} (predicted queue wait "
                   f"{wait_ms} ms); retry after the Retry-After delay")
        return Rejection(reason, too_many_requests(message, retry_after_s(wait_ms)))

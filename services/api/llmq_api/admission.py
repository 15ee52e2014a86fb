"""Admission control (pure): refuse a new request before it costs anything when its model's class is overloaded or
its model has no worker.

Inputs: the batchers' saturation reports, per model (per ``PRIORITY_CLASSES`` entry: queue depth, oldest queued age,
backlog drain rate; live workers, their slots and the requests/s their heartbeats promise, last worker heartbeat), the
requests this pod admitted since those reports were sent (:class:`Admitted`), every live pod's admitted requests that
have not ended (:class:`Unfinished`, shared through Redis), and this pod's in-flight count.

A new request of class c for model m waits behind every request of m queued in c and in the classes more important
than c (other models' queues do not delay it and never shed it). That work is the larger of two counts:
- what the batchers reported queued, plus what this pod admitted since (reports also see Kafka-direct and batch work);
- the requests of m in c and above that the API pods admitted and that have not ended, less the workers' slots (those
  may be running): a lower bound that already holds while the requests are still in Kafka, unread by any batcher, and
  that counts the other pods' admissions within a publish interval (a burst is admitted faster than reports come).
Its predicted queue wait is that work divided by the rate m's workers drain it at: the backlog drain rate the batchers
measured while such work waited (never above the capacity the heartbeats promise), or, until one is measured, half
that capacity (the pipeline, not the nominal rate, may be the limit: on a 2-core machine two llmq-sim workers
promising 256 requests/s delivered about 128; the measured rate replaces the bound within two batcher reports of a
backlog, and the batchers keep it between backlogs). Class c of model m is shed (429) when

- that predicted wait exceeds ``api_shed_wait_ms[c]``, unless the work ahead fits in the workers' next batch (fewer
  requests than their slots: an idle stack never refuses for a wait, whatever the threshold) or it is deferred work of
  a model without workers (it waits for them, so that an autoscaler scaling the model from zero sees its queue), or
- the requests of m queued in c and above fill ``api_shed_share[c]`` of ``batcher_max_queued``, or
- this pod's in-flight requests fill ``api_shed_share[c]`` of ``api_max_in_flight``.

Both thresholds fall with priority (settings' defaults), so the lowest class is always shed first. The answer's
``Retry-After`` is the predicted wait rounded up to whole seconds (1 to :data:`MAX_RETRY_AFTER_S`); admitted requests
carry the prediction in ``x-llmq-predicted-wait-ms``.

Staleness: each batcher rewrites its report every ``SATURATION_REPORT_INTERVAL_MS`` (1 s); one older than
:data:`STALE_REPORT_INTERVALS` of those intervals (``api_saturation_stale_ms``, 5 s by default: the setting is that
many intervals) missed that many rewrites in a row and is stale (:func:`is_stale`). A stale report counts for nothing:
its queues, workers, slots and drain rates are left out, as if its batcher were gone. With no fresh report at all a pod
knows no queue and no worker: it never answers 503 ``model_unavailable`` for want of one, predicts a wait only from
the requests admitted within ``api_saturation_stale_ms`` and the pods' unfinished ones, and so sheds by its own
in-flight cap and those counts until a fresh report arrives. The pods' unfinished reports age out by the same rule.

A model whose workers have all been gone for longer than ``worker_heartbeat_timeout_ms`` (or that no batcher has seen a
worker of since it started, that long ago) answers interactive and near_interactive requests (a person waits for
both) with 503 ``model_unavailable`` at once; deferred requests still queue.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from llmq_api.errors import ApiError
from llmq_core import wire
from llmq_core.constants import DEFERRED, HTTP_RETRY_AFTER, HTTP_TRAFFIC_CLASS, PRIORITY_CLASSES
from llmq_core.requests import echo
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType

MAX_RETRY_AFTER_S = 60
UNMEASURED_SHARE = 0.5  # of the heartbeats' capacity: the drain rate assumed until a backlog's rate is measured
MODEL_UNAVAILABLE_CODE = "model_unavailable"
STALE_REPORT_INTERVALS = 5  # report intervals a report may miss before it is stale: api_saturation_stale_ms's default


@dataclass(frozen=True, slots=True)
class Queues:
    """One model's queues merged over the batchers per PRIORITY_CLASSES entry: requests queued (sum), oldest queued
    age (ms, max), backlog drain rate of the class and those above (requests/s, sum: each batcher drains its share)."""

    depth: Mapping[str, int]
    oldest_age_ms: Mapping[str, int]
    drain_per_s: Mapping[str, float] = field(default_factory=dict)


EMPTY = Queues({}, {})


@dataclass(frozen=True, slots=True)
class Prediction:
    """What waits ahead of a new request: ``queued`` requests (reported, plus admitted here since), the predicted queue
    wait (ms), and whether that work fits in the workers' next batch (then it is never shed for its wait)."""

    queued: int
    wait_ms: int
    next_batch: bool


@dataclass(frozen=True, slots=True)
class Saturation:
    """The fresh reports merged at ``as_of_ms``: queues per model; live workers per model (the most any batcher
    sees: they all hear the same heartbeats); the newest heartbeat of each model's workers; since when the batchers
    have been watching (the earliest start among them; None without a fresh report, when nothing is known); per model
    the slots and requests/s of its workers (the most any batcher sees); (model, class) -> requests this pod
    admitted since the reports were sent; and (model, class) -> admitted requests of every live pod not ended yet."""

    queues: Mapping[str, Queues] = field(default_factory=dict)
    workers: Mapping[str, int] = field(default_factory=dict)
    worker_seen_ms: Mapping[str, int] = field(default_factory=dict)
    watching_since_ms: int | None = None
    as_of_ms: int = 0
    slots: Mapping[str, int] = field(default_factory=dict)
    capacity_per_s: Mapping[str, float] = field(default_factory=dict)
    admitted: Mapping[tuple[str, str], int] = field(default_factory=dict)
    unfinished: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def predict(self, model: str, priority_class: str) -> Prediction:
        """The wait of a new request of ``priority_class`` for ``model``: the work queued ahead of it (its class and
        those above) over the rate it drains at. With neither a measured rate nor a worker's capacity (a model without
        workers) the oldest queued age ahead is the only signal."""
        queues = self.queues.get(model, EMPTY)
        ahead = PRIORITY_CLASSES[: PRIORITY_CLASSES.index(priority_class) + 1]
        reported = sum(queues.depth.get(c, 0) + self.admitted.get((model, c), 0) for c in ahead)
        held = sum(self.unfinished.get((model, c), 0) for c in ahead) - self.slots.get(model, 0)
        queued = max(reported, held)
        rate_per_s = self.drain_rate_per_s(model, priority_class)
        if rate_per_s > 0:
            wait_ms = math.ceil(queued * 1000 / rate_per_s)
        else:
            wait_ms = max((queues.oldest_age_ms.get(c, 0) for c in ahead), default=0)
        return Prediction(queued, wait_ms, queued < self.slots.get(model, 0))

    def drain_rate_per_s(self, model: str, priority_class: str) -> float:
        """The measured backlog drain rate of ``priority_class`` and above, at most the heartbeats' capacity; until
        one is measured, :data:`UNMEASURED_SHARE` of that capacity."""
        measured = self.queues.get(model, EMPTY).drain_per_s.get(priority_class, 0.0)
        capacity = self.capacity_per_s.get(model, 0.0)
        if measured and capacity:
            return min(measured, capacity)
        return measured or capacity * UNMEASURED_SHARE

    def worker_gone_ms(self, model: str) -> int | None:
        """How long ``model`` has been without a live worker (ms); None while it has one or nothing is known."""
        if self.watching_since_ms is None or self.workers.get(model):
            return None
        return self.as_of_ms - (self.worker_seen_ms.get(model) or self.watching_since_ms)


IDLE = Saturation()


class Admitted:
    """This pod's admissions per (model, priority class), kept until a report sent after them covers them: the
    batchers' next reports will count them, the ones read so far do not (and other pods' admissions show up there)."""

    def __init__(self) -> None:
        self._log: deque[tuple[int, str, str, int]] = deque()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, model: str, priority_class: str, now_ms: int, count: int = 1) -> None:
        """Count an admission at ``now_ms`` (``count=-1`` takes back one that a later check refused)."""
        self._log.append((now_ms, model, priority_class, count))
        self._counts[(model, priority_class)] += count

    def since(self, since_ms: int) -> dict[tuple[str, str], int]:
        """(model, class) -> admissions after ``since_ms``; older ones are forgotten."""
        log, counts = self._log, self._counts
        while log and log[0][0] <= since_ms:
            _, model, priority_class, count = log.popleft()
            counts[(model, priority_class)] -= count
            if not counts[(model, priority_class)]:
                del counts[(model, priority_class)]
        return dict(counts)


class Unfinished:
    """This pod's admitted requests that have not ended, per (model, priority class)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def start(self, model: str, priority_class: str) -> Callable[[], None]:
        """Count a request from now; returns what ends it (once, however often it is called)."""
        key = (model, priority_class)
        self.counts[key] += 1
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self.counts[key] -= 1
                if not self.counts[key]:
                    del self.counts[key]

        return end

    def report(self, instance_id: str, now_ms: int) -> wire.PodUnfinished:
        models: dict[str, dict[str, int]] = {}
        for (model, priority_class), count in self.counts.items():
            models.setdefault(model, {})[priority_class] = count
        return wire.PodUnfinished(instance_id=instance_id, sent_ms=now_ms, models=models)


def is_stale(sent_ms: int, now_ms: int, stale_ms: int) -> bool:
    """Whether a report sent at ``sent_ms`` counts for nothing at ``now_ms`` (epoch ms): older than ``stale_ms``
    (Settings.api.saturation_stale_ms: STALE_REPORT_INTERVALS report intervals by default)."""
    return now_ms - sent_ms > stale_ms


def all_unfinished(
    own: Mapping[tuple[str, str], int], others: Iterable[wire.PodUnfinished], now_ms: int, stale_ms: int
) -> dict[tuple[str, str], int]:
    """(model, class) -> unfinished requests of this pod (``own``, exact) and of the other pods whose report was sent
    within ``stale_ms`` of ``now_ms`` (a pod that stopped reporting is gone; the batchers cancel its work)."""
    total = Counter(own)
    for report in others:
        if not is_stale(report.sent_ms, now_ms, stale_ms):
            total.update({(model, c): n for model, by_class in report.models.items() for c, n in by_class.items()})
    return dict(total)


def merge_reports(
    reports: Iterable[wire.BatcherSaturation],
    now_ms: int,
    stale_ms: int,
    heard_ms: Mapping[str, int] | None = None,
    admitted: Admitted | None = None,
    unfinished: Mapping[tuple[str, str], int] | None = None,
) -> Saturation:
    """Merge the reports sent within ``stale_ms`` of ``now_ms``; a queue's oldest request has aged since its report.
    ``heard_ms``: model -> the last worker heartbeat this pod heard itself, which knows of a new worker up to a report
    interval sooner than the batchers' reports do. ``admitted``: this pod's admissions; those after the oldest fresh
    report count as queued (without a fresh report, those within ``stale_ms``). ``unfinished``: every live pod's
    admitted requests not ended yet (:func:`all_unfinished`)."""
    depth: dict[str, dict[str, int]] = {}
    oldest: dict[str, dict[str, int]] = {}
    drain: dict[str, dict[str, float]] = {}
    workers: dict[str, int] = {}
    slots: dict[str, int] = {}
    capacity: dict[str, float] = {}
    seen: dict[str, int] = dict(heard_ms or {})
    starts, sent = [], []
    for report in reports:
        if is_stale(report.sent_ms, now_ms, stale_ms):
            continue
        since_ms = now_ms - report.sent_ms
        sent.append(report.sent_ms)
        if report.started_ms:
            starts.append(report.started_ms)
        for model, load in report.models.items():
            workers[model] = max(workers.get(model, 0), load.workers)
            slots[model] = max(slots.get(model, 0), load.slots)
            capacity[model] = max(capacity.get(model, 0.0), load.capacity_per_s)
            seen[model] = max(seen.get(model, 0), load.worker_seen_ms)
            _add_queues(
                load.classes,
                since_ms,
                depth.setdefault(model, {}),
                oldest.setdefault(model, {}),
                drain.setdefault(model, {}),
            )
    local = admitted.since(min(sent, default=now_ms - stale_ms)) if admitted is not None else {}
    return Saturation(
        {m: Queues(depth[m], oldest[m], drain[m]) for m in depth},
        workers,
        seen,
        min(starts, default=None),
        now_ms,
        slots,
        capacity,
        local,
        dict(unfinished or {}),
    )


def _add_queues(
    classes: Mapping[str, wire.QueueLoad],
    since_ms: int,
    depth: dict[str, int],
    oldest: dict[str, int],
    drain: dict[str, float],
) -> None:
    for name, load in classes.items():
        depth[name] = depth.get(name, 0) + load.depth
        drain[name] = drain.get(name, 0.0) + load.backlog_drained_per_s
        if load.depth:
            oldest[name] = max(oldest.get(name, 0), load.oldest_age_ms + max(since_ms, 0))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused (metrics label) and the client's error."""

    reason: str
    error: ApiError


def too_many_requests(message: str, retry_after_s: int, type: str = ErrorType.RATE_LIMIT) -> ApiError:
    """A 429 ``rate_limit_exceeded`` with an integer ``Retry-After`` (seconds)."""
    return ApiError(
        429, message, type=type, code=ErrorCode.RATE_LIMIT_EXCEEDED, headers={HTTP_RETRY_AFTER: str(retry_after_s)}
    )


def model_unavailable(model: str, retry_after: int, deferred_allowed: bool) -> ApiError:
    """A 503 ``model_unavailable``: no worker serves ``model`` now. Sending it as deferred work is suggested only to
    a caller whose key may use that class (``deferred_allowed``): to any other it would be a 403."""
    deferred = f", or send the request as deferred work ({HTTP_TRAFFIC_CLASS}: {DEFERRED}), which waits for a worker"
    return ApiError(
        503,
        f"The model {echo(model)} has no running worker right now; retry after the Retry-After delay"
        + (deferred if deferred_allowed else ""),
        type=ErrorType.SERVER,
        param="model",
        code=MODEL_UNAVAILABLE_CODE,
        headers={HTTP_RETRY_AFTER: str(retry_after)},
    )


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
        return cls(
            wait_ms=dict(settings.api.shed_wait_ms),
            share=dict(settings.api.shed_share),
            max_in_flight=settings.api.max_in_flight,
            max_queued=settings.batcher.max_queued,
            worker_timeout_ms=settings.batcher.worker_heartbeat_timeout_ms,
        )

    def check(
        self, priority_class: str, model: str, saturation: Saturation, in_flight: int, deferred_allowed: bool = True
    ) -> Rejection | None:
        """None to admit a request of ``priority_class`` for ``model``; otherwise the Rejection (a 429 or a 503).
        ``deferred_allowed``: whether the caller's key may send deferred work (a 503 suggests it only then)."""
        gone_ms = saturation.worker_gone_ms(model)
        gone = gone_ms is not None and gone_ms > self.worker_timeout_ms
        if gone and priority_class != DEFERRED:
            error = model_unavailable(model, retry_after_s(self.worker_timeout_ms), deferred_allowed)
            return Rejection(MODEL_UNAVAILABLE_CODE, error)
        predicted = saturation.predict(model, priority_class)
        share = self.share.get(priority_class, 1.0)
        limit_ms = self.wait_ms.get(priority_class)
        if limit_ms is not None and predicted.wait_ms > limit_ms and not predicted.next_batch and not gone:
            reason = "queue_wait"
        elif predicted.queued >= share * self.max_queued:
            reason = "queue_depth"
        elif in_flight >= share * self.max_in_flight:
            reason = "pod_in_flight"
        else:
            return None
        message = (
            f"The service is overloaded for {priority_class} requests of {model} (predicted queue wait "
            f"{predicted.wait_ms} ms); retry after the Retry-After delay"
        )
        return Rejection(reason, too_many_requests(message, retry_after_s(predicted.wait_ms)))

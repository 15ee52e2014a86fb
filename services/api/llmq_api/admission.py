"""Admission control (pure): refuse a new request before it costs anything when its model's class is overloaded or
its model has no worker.

Inputs: the batchers' saturation reports, per model (per ``PRIORITY_CLASSES`` entry: queue depth, oldest queued age,
recent dispatch rate, backlog drain rate; live workers, their slots and the requests/s their heartbeats promise, last
worker heartbeat), the requests this pod admitted since those reports were sent (:class:`Admitted`), every live pod's
admitted requests that have not ended (:class:`Unfinished`, shared through Redis), and this pod's in-flight count.

A new request of class c for model m waits behind every request of m queued in c and in the classes more important
than c (other models' queues do not delay it and never shed it). That work (:meth:`Saturation.queued`) is the larger
of two counts:
- what the batchers reported queued, plus what this pod admitted since each report (its share of the batchers'
  partitions), less what those queues were dispatched at over the reports' age (reports also see Kafka-direct and
  batch work);
- the requests of m in c and above that the API pods admitted and that have not ended, less the workers' slots (those
  may be running): a lower bound that already holds while the requests are still in Kafka, unread by any batcher, and
  that counts the other pods' admissions within a publish interval (a burst is admitted faster than reports come).
The workers take that work in cycles (:func:`cycles_wait_ms`): a fixed-time batch, or a continuous-batching slot's
turn (a burst's requests start together and end together), of ``slots / rate`` seconds (at most slots over the
heartbeats' capacity). Free slots take a cycle's worth at once; the next cycle comes half a cycle from now while the
workers are busy (a request of m has waited over :data:`SATURATED_AGE_MS`, or the pods' unfinished requests exceed
the queued ones), else one cycle and the batch window from now. The rate is the backlog drain rate the batchers
measured (``llmq_batcher.saturation.BacklogDrain``: only while a request waited a whole report interval, per live slot,
kept through idle time; a class with none of its own takes the nearest class's; a batcher with none counts as the
others' mean), or until one is measured, what the workers are dispatched now plus half the rest of the heartbeats'
capacity (the pipeline, not the nominal rate, may be the limit: on a 2-core machine two llmq-sim workers promising 256
requests/s delivered about 128); never less than what they are dispatched now. The capacity bounds no measured rate: a
continuous-batching worker's falls with its drain estimate. Of that rate, class c gets what the
classes above it leave: they keep arriving and go first, so the rate they are dispatched at is taken off (a request of
c waits W / (mu - lambda_above), not W / mu: under sustained overload of paid and free traffic free requests were
admitted at a 5 s prediction and waited 10 s and more), down to :data:`MIN_CLASS_SHARE` of it.

Class c of model m is shed (429) when

- that predicted wait exceeds ``api_shed_wait_ms[c]``, unless the work ahead fits in the workers' next batch (fewer
  requests than the free slots the classes above leave: an idle stack never refuses for a wait, whatever the
  threshold) or it is deferred work of a model without workers (it waits for them, so that an autoscaler scaling the
  model from zero sees its queue), or
- the requests of m queued in c and above fill ``api_shed_share[c]`` of ``batcher_max_queued``, or
- this pod's in-flight requests fill ``api_shed_share[c]`` of ``api_max_in_flight``.

Both thresholds fall with priority (settings' defaults), so the lowest class is always shed first. The answer's
``Retry-After`` is the predicted wait rounded up to whole seconds (1 to :data:`MAX_RETRY_AFTER_S`); admitted requests
carry the prediction in ``x-llmq-predicted-wait-ms``, and their measured queue wait is compared with it
(:func:`prediction_verdict`, metric ``llmq_api_admission_prediction_error_seconds``).

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

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmq_api.errors import ApiError
from llmq_core import wire
from llmq_core.constants import DEFERRED, HTTP_RETRY_AFTER, HTTP_TRAFFIC_CLASS, PRIORITY_CLASSES
from llmq_core.requests import echo
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType

MAX_RETRY_AFTER_S = 60
UNMEASURED_SHARE = 0.5  # of the heartbeats' capacity: the drain rate assumed until a backlog's rate is measured
SATURATED_AGE_MS = 1000  # a queued request this old waited for a slot, not for a batch window (those are shorter)
CYCLE_START_MS = 50  # an idle fleet's cycles start after the batcher's window and the hops to the worker (ms)
PREDICTION_TOLERANCE, PREDICTION_FLOOR_MS = 0.5, 250  # a prediction within max(0.5 x measured, 250 ms) held
MIN_CLASS_SHARE = 0.05  # of the drain rate: the least a class is predicted to get while the classes above take the rest
MODEL_UNAVAILABLE_CODE = "model_unavailable"
STALE_REPORT_INTERVALS = 5  # report intervals a report may miss before it is stale: api_saturation_stale_ms's default


@dataclass(frozen=True, slots=True)
class Queues:
    """One model's queues merged over the batchers per PRIORITY_CLASSES entry: requests queued (sum), oldest queued
    age (ms, max), backlog drain rate of the class and those above (requests/s, sum: each batcher drains its share),
    and the class's own recent dispatch rate (requests/s, sum, smoothed over about 5 s)."""

    depth: Mapping[str, int]
    oldest_age_ms: Mapping[str, int]
    drain_per_s: Mapping[str, float] = field(default_factory=dict)
    dispatched_per_s: Mapping[str, float] = field(default_factory=dict)


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
    admitted since the reports were sent (each report's share: :meth:`Admitted.after`); (model, class) -> admitted
    requests of every live pod not ended yet; and the reports' mean age (ms)."""

    queues: Mapping[str, Queues] = field(default_factory=dict)
    workers: Mapping[str, int] = field(default_factory=dict)
    worker_seen_ms: Mapping[str, int] = field(default_factory=dict)
    watching_since_ms: int | None = None
    as_of_ms: int = 0
    slots: Mapping[str, int] = field(default_factory=dict)
    capacity_per_s: Mapping[str, float] = field(default_factory=dict)
    admitted: Mapping[tuple[str, str], float] = field(default_factory=dict)
    unfinished: Mapping[tuple[str, str], int] = field(default_factory=dict)
    report_age_ms: int = 0  # what the reported queues were dispatched at over this long counts as gone

    def predict(self, model: str, priority_class: str) -> Prediction:
        """The wait of a new request of ``priority_class`` for ``model``: the work queued ahead of it (its class and
        those above, :meth:`queued`) taken by the workers in cycles (:func:`cycles_wait_ms`) at the rate it drains at
        (:meth:`drain_rate_per_s`). With neither a measured rate nor a worker's capacity (a model without workers) the
        oldest queued age ahead is the only signal. It is in the workers' next batch when the work ahead is less than
        the free slots the classes above leave it."""
        queues, ahead, slots = self.queues.get(model, EMPTY), _ahead(priority_class), self.slots.get(model, 0)
        queued = self.queued(model, ahead)
        total_per_s = self.backlog_rate_per_s(model, priority_class)
        rate_per_s = self.drain_rate_per_s(model, priority_class, total_per_s)
        running = self.running(model, priority_class)
        share = rate_per_s / total_per_s if total_per_s else 1.0
        next_batch = queued < (slots - running) * share
        if rate_per_s <= 0:
            return Prediction(queued, max((queues.oldest_age_ms.get(c, 0) for c in ahead), default=0), next_batch)
        capacity = self.capacity_per_s.get(model, 0.0)
        cycle_s = min(slots / total_per_s, slots / capacity if capacity else math.inf) if slots else 0.0
        wait_ms = cycles_wait_ms(queued, slots - running, running > 0, rate_per_s, cycle_s)
        return Prediction(queued, wait_ms, next_batch)

    def queued(self, model: str, classes: Iterable[str]) -> int:
        """Requests of ``model`` in ``classes`` not started yet: what the batchers reported queued plus what this pod
        admitted since, less what those classes were dispatched at over the reports' mean age; at least the requests
        of those classes that the API pods admitted and that have not ended, less the workers' slots (the most that
        may be running: a lower bound that already holds while the requests are still in Kafka)."""
        queues, classes = self.queues.get(model, EMPTY), tuple(classes)
        reported = sum(queues.depth.get(c, 0) + self.admitted.get((model, c), 0) for c in classes)
        reported -= sum(queues.dispatched_per_s.get(c, 0.0) for c in classes) * self.report_age_ms / 1000
        held = sum(self.unfinished.get((model, c), 0) for c in classes) - self.slots.get(model, 0)
        return max(round(reported), held, 0)

    def running(self, model: str, priority_class: str = DEFERRED) -> int:
        """Requests of ``model`` running on its workers as a request of ``priority_class`` finds them: all the slots
        while a queued request of the model has waited longer than :data:`SATURATED_AGE_MS` (no batch window holds one
        that long: no slot was free; deferred work counts only for deferred, as the other classes preempt it or keep a
        share from it), else the pods' unfinished requests not queued (at most the slots)."""
        queues, slots = self.queues.get(model, EMPTY), self.slots.get(model, 0)
        ages = (age for c, age in queues.oldest_age_ms.items() if c != DEFERRED or priority_class == DEFERRED)
        if max(ages, default=0) >= SATURATED_AGE_MS:
            return slots
        unfinished = sum(n for (m, _), n in self.unfinished.items() if m == model)
        return min(max(unfinished - self.queued(model, PRIORITY_CLASSES), 0), slots)

    def backlog_rate_per_s(self, model: str, priority_class: str) -> float:
        """Requests/s of ``priority_class`` and above that ``model``'s workers drain a backlog at: what the batchers
        measured (through idle time, per live slot: ``llmq_batcher.saturation.BacklogDrain``), else the rate measured
        for the nearest class that has one (below first: its backlogs include this class's; the workers drain any
        backlog about as fast), or until one is measured :data:`UNMEASURED_SHARE` of the heartbeats' capacity beyond
        what the workers are dispatched now; never less than that (they demonstrably take it). The heartbeats'
        capacity bounds no measured rate: a continuous-batching worker's falls with its drain estimate (a hundredfold
        in the seconds after idle, before the worker measured its token rate over busy time only)."""
        queues = self.queues.get(model, EMPTY)
        measured, dispatched = queues.drain_per_s, sum(queues.dispatched_per_s.values())
        index = PRIORITY_CLASSES.index(priority_class)
        nearest = (*PRIORITY_CLASSES[index:], *reversed(PRIORITY_CLASSES[:index]))
        rate = next((measured[c] for c in nearest if measured.get(c, 0.0) > 0), 0.0)
        if not rate:
            capacity = self.capacity_per_s.get(model, 0.0)
            rate = dispatched + UNMEASURED_SHARE * max(capacity - dispatched, 0.0)
        return max(rate, dispatched)

    def drain_rate_per_s(self, model: str, priority_class: str, total: float | None = None) -> float:
        """Requests/s the work ahead of a new request of ``priority_class`` drains at: the backlog rate (mu), less
        the rate the classes above are dispatched at (lambda: they keep arriving and go first, so the request waits
        queued / (mu - lambda), not queued / mu), at least :data:`MIN_CLASS_SHARE` of mu (``total``: mu, if known)."""
        total = self.backlog_rate_per_s(model, priority_class) if total is None else total
        dispatched = self.queues.get(model, EMPTY).dispatched_per_s
        above = sum(dispatched.get(c, 0.0) for c in _ahead(priority_class)[:-1])
        return max(total - above, total * MIN_CLASS_SHARE)

    def worker_gone_ms(self, model: str) -> int | None:
        """How long ``model`` has been without a live worker (ms); None while it has one or nothing is known."""
        if self.watching_since_ms is None or self.workers.get(model):
            return None
        return self.as_of_ms - (self.worker_seen_ms.get(model) or self.watching_since_ms)


IDLE = Saturation()


def cycles_wait_ms(queued: int, free: int, busy: bool, rate_per_s: float, cycle_s: float) -> int:
    """The wait (ms) of a request with ``queued`` requests ahead of it, taken by the workers in cycles of
    ``cycle_s`` (a fixed-time batch, or a continuous-batching slot's turn: slots over the rate, at most slots over
    the heartbeats' capacity), each taking ``rate_per_s * cycle_s`` of them: the first ``free`` slots' worth (at most a
    cycle's) start at once; the next cycle starts half a cycle from now on average while some run (``busy``), else a
    cycle and :data:`CYCLE_START_MS` from now. Without cycles (no slots known) the work ahead over the rate."""
    per_cycle = rate_per_s * cycle_s
    if per_cycle <= 0:
        return math.ceil(queued * 1000 / rate_per_s)
    first = min(max(free, 0), per_cycle)
    if queued < first:
        return 0
    if busy:
        return math.ceil((0.5 + (queued - first) // per_cycle) * cycle_s * 1000)
    return math.ceil((1 + (queued - first) // per_cycle) * cycle_s * 1000) + CYCLE_START_MS


def _ahead(priority_class: str) -> tuple[str, ...]:
    """``priority_class`` and the classes above it, most important first."""
    return PRIORITY_CLASSES[: PRIORITY_CLASSES.index(priority_class) + 1]


class Admitted:
    """This pod's admissions per (model, priority class), kept until a report sent after them covers them: the
    batchers' next reports will count them, the ones read so far do not (and other pods' admissions show up there)."""

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (ms, admissions up to it, from the base)
        self._base: Counter[tuple[str, str]] = Counter()  # admissions forgotten, as the marks count them

    def add(self, model: str, priority_class: str, now_ms: int, count: int = 1) -> None:
        """Count an admission at ``now_ms`` (``count=-1`` takes back one that a later check refused)."""
        marks = self._marks.setdefault((model, priority_class), [])
        marks.append((now_ms, (marks[-1][1] if marks else self._base[(model, priority_class)]) + count))

    def since(self, since_ms: int) -> dict[tuple[str, str], int]:
        """(model, class) -> admissions after ``since_ms``; older ones are forgotten."""
        return {key: round(n) for key, n in self.after([since_ms]).items()}

    def after(self, sent_ms: Sequence[int]) -> dict[tuple[str, str], float]:
        """(model, class) -> the admissions after each of the reports sent at ``sent_ms``, averaged over them: each
        batcher's report covers its share of them (a pod's requests spread evenly over the batchers' partitions)
        up to when it was sent. Those before the oldest report are forgotten."""
        oldest, counts = min(sent_ms), {}
        for key in list(self._marks):
            marks = self._marks[key]
            cut = bisect.bisect_right(marks, (oldest, math.inf))
            if cut:
                self._base[key] = marks[cut - 1][1]
                del marks[:cut]
            if not marks:
                del self._marks[key], self._base[key]
                continue
            total = marks[-1][1]
            before = [self._base[key] if i == 0 else marks[i - 1][1] for i in self._cuts(marks, sent_ms)]
            mean = total - sum(before) / len(before)
            if mean:
                counts[key] = mean
        return counts

    @staticmethod
    def _cuts(marks: list[tuple[int, int]], sent_ms: Sequence[int]) -> list[int]:
        return [bisect.bisect_right(marks, (t, math.inf)) for t in sent_ms]


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
    Each batcher's backlog drain rate is its share of the fleet's: they add up, and a batcher that has measured none
    yet (its queue never waited a whole report interval) counts as the mean of those that have.
    ``heard_ms``: model -> the last worker heartbeat this pod heard itself, which knows of a new worker up to a report
    interval sooner than the batchers' reports do. ``admitted``: this pod's admissions; those after each fresh report
    count as queued for its share (without a fresh report, those within ``stale_ms``). ``unfinished``: every live pod's
    admitted requests not ended yet (:func:`all_unfinished`)."""
    depth: dict[str, dict[str, int]] = {}
    oldest: dict[str, dict[str, int]] = {}
    drain: dict[str, dict[str, list[float]]] = {}
    dispatched: dict[str, dict[str, float]] = {}
    workers: dict[str, int] = {}
    slots: dict[str, int] = {}
    capacity: dict[str, float] = {}
    seen: dict[str, int] = dict(heard_ms or {})
    starts: list[int] = []
    sent: list[int] = []
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
                dispatched.setdefault(model, {}),
            )
    local = admitted.after(sent or [now_ms - stale_ms]) if admitted is not None else {}
    return Saturation(
        {m: Queues(depth[m], oldest[m], _fleet_rates(drain[m]), dispatched[m]) for m in depth},
        workers,
        seen,
        min(starts, default=None),
        now_ms,
        slots,
        capacity,
        local,
        dict(unfinished or {}),
        now_ms - sum(sent) // len(sent) if sent else 0,
    )


def _add_queues(
    classes: Mapping[str, wire.QueueLoad],
    since_ms: int,
    depth: dict[str, int],
    oldest: dict[str, int],
    drain: dict[str, list[float]],
    dispatched: dict[str, float],
) -> None:
    for name, load in classes.items():
        depth[name] = depth.get(name, 0) + load.depth
        drain.setdefault(name, []).append(load.backlog_drained_per_s)
        dispatched[name] = dispatched.get(name, 0.0) + load.drained_per_s
        if load.depth:
            oldest[name] = max(oldest.get(name, 0), load.oldest_age_ms + max(since_ms, 0))


def _fleet_rates(by_batcher: Mapping[str, list[float]]) -> dict[str, float]:
    """Class -> the fleet's backlog drain rate (requests/s) from each batcher's: their sum, each batcher without a
    measured one (0) counted as the mean of those with one."""
    fleet = {}
    for name, rates in by_batcher.items():
        measured = [r for r in rates if r > 0]
        fleet[name] = sum(measured) * len(rates) / len(measured) if measured else 0.0
    return fleet


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


def prediction_verdict(predicted_ms: int, measured_ms: int) -> str:
    """How an admitted request's predicted queue wait held (issue 28's rule): ``within`` max(PREDICTION_TOLERANCE x
    the measured wait, PREDICTION_FLOOR_MS) of the measured one, else ``under`` (it waited longer than predicted) or
    ``over`` (shorter)."""
    if abs(predicted_ms - measured_ms) <= max(PREDICTION_TOLERANCE * measured_ms, PREDICTION_FLOOR_MS):
        return "within"
    return "under" if measured_ms > predicted_ms else "over"


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

"""The batcher's admission signal for API pods (``wire.BatcherSaturation`` in Redis ``llmq:saturation``).

Per model and priority class: queue depth, oldest queued age, drain rate (requests dispatched per second, smoothed) and
backlog drain rate (the same over the class and those above, measured only while some of them waited throughout,
scaled to the slots live now: what API pods divide the work queued ahead of a new request by); per model: live
workers, their slots, the requests/s their heartbeats promise and the last worker heartbeat. Only models of the
catalogue or with a worker are reported: a model name made up by a Kafka producer has no worker, so it cannot grow the
report (its requests still count in the all-models ``classes``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping

import msgspec

from llmq_batcher.policy import CLASS_KEYS, BatchDispatch, class_index
from llmq_core import constants, wire

DRAIN_TAU_MS = 5000  # time constant of the drain rate's smoothing: a burst's effect halves in about 3.5 s
MIN_RATE_PER_S = 0.001  # slower than this reads 0 and is forgotten
BACKLOG_TAU_MS = 20_000  # backlog time over which the backlog drain rate forgets (idle time does not count)
# A backlog's drain is measured over intervals at least this long: a shorter one (a drain's forced report, the first
# after start) holds too few batches, so one batch more or less could set the rate; its dispatches count in the next.
MIN_BACKLOG_INTERVAL_MS = constants.SATURATION_REPORT_INTERVAL_MS

Rates = Mapping[str, Mapping[str, float]]  # model -> priority class -> requests/s


class DrainMeter:
    """Requests dispatched per second per model and priority class, smoothed exponentially over the intervals between
    :meth:`rates` calls (time constant ``tau_ms``), measured from ``start_ms``. Only dispatched models appear: those
    with workers."""

    def __init__(self, start_ms: int, tau_ms: int = DRAIN_TAU_MS) -> None:
        self._tau_ms = tau_ms
        self._counts: Counter[tuple[str, str]] = Counter()
        self._rates: dict[tuple[str, str], float] = {}
        self._last_ms = start_ms

    def dispatched(self, batches: Iterable[BatchDispatch]) -> None:
        _count(self._counts, batches)

    def rates(self, now_ms: int) -> Rates:
        """The smoothed rates at ``now_ms``, taking in what was dispatched since the previous call."""
        elapsed_ms = now_ms - self._last_ms
        if elapsed_ms > 0:
            alpha = 1 - math.exp(-elapsed_ms / self._tau_ms)
            rates = {}
            for key in self._rates.keys() | self._counts.keys():
                old = self._rates.get(key, 0.0)
                rate = old + alpha * (self._counts[key] * 1000 / elapsed_ms - old)
                if rate >= MIN_RATE_PER_S:
                    rates[key] = rate
            self._rates, self._last_ms = rates, now_ms
            self._counts.clear()
        nested: dict[str, dict[str, float]] = {}
        for (model, key), rate in self._rates.items():
            nested.setdefault(model, {})[key] = rate
        return nested


class BacklogDrain:
    """Per model and priority class c: requests of c and the classes above dispatched per second while a backlog of
    them waited, so it is the rate the workers (and the pipeline before them) drain a backlog at, not the arrival rate
    of a system with room to spare. An interval between :meth:`rates` calls counts only when some request of c or above
    waited through all of it (at its end the oldest of them is at least the interval old) and what still waits is at
    least what went out in it: a queue merely non-empty at both ends (a batch window, a fixed-time worker's next
    window) holds the arrival rate, which under light load is far below the drain rate; and a backlog's last interval
    is left out, where this batcher may have had the workers to itself while the other batchers had run dry (their
    rates are summed: each must be its share of the fleet's). The rate is kept per slot of the model's live workers and
    reported times the slots live now, so a fleet that shrank or grew since drains at its own rate. It is the ratio of
    the requests dispatched to the time over those intervals, both forgotten with time constant ``tau_ms`` of backlog
    time: a fixed-time fleet dispatches a whole window at once, so one interval holds a window more or less (a 500 ms
    window in a 1 s interval: 50% off), and a ratio over many is off by that one window over all of them. Between
    backlogs, idle included, the last value stands. Intervals shorter than :data:`MIN_BACKLOG_INTERVAL_MS` are joined
    to the next."""

    def __init__(self, start_ms: int, tau_ms: int = BACKLOG_TAU_MS) -> None:
        self._tau_ms = tau_ms
        self._counts: Counter[tuple[str, str]] = Counter()
        self._sums: dict[tuple[str, str], tuple[float, float]] = {}  # (dispatched per live slot, seconds), forgotten
        self._last_ms = start_ms

    def dispatched(self, batches: Iterable[BatchDispatch]) -> None:
        _count(self._counts, batches)

    def rates(self, now_ms: int, models: Mapping[str, wire.ModelLoad]) -> Rates:
        """The rates (requests/s) at ``now_ms`` with each model's slots live now, taking in what was dispatched since
        the previous call and how long the oldest queued request has waited now."""
        elapsed_ms = now_ms - self._last_ms
        if elapsed_ms >= MIN_BACKLOG_INTERVAL_MS:
            for model, state in models.items():
                self._measure(model, state, elapsed_ms)
            self._counts.clear()
            self._last_ms = now_ms
        nested: dict[str, dict[str, float]] = {}
        for (model, key), (per_slot, seconds) in self._sums.items():
            state = models.get(model)
            if state is not None and state.slots:
                nested.setdefault(model, {})[key] = per_slot / seconds * state.slots
        return nested

    def _measure(self, model: str, state: wire.ModelLoad, elapsed_ms: int) -> None:
        oldest_ms = queued = dispatched = 0
        for key in CLASS_KEYS:  # most important first: each class adds to the ones above it
            load = state.classes.get(key)
            if load is not None and load.depth:
                oldest_ms = max(oldest_ms, load.oldest_age_ms)
                queued += load.depth
            dispatched += self._counts[(model, key)]
            if oldest_ms >= elapsed_ms and queued >= dispatched and state.slots:
                keep = math.exp(-elapsed_ms / self._tau_ms)
                per_slot, seconds = self._sums.get((model, key), (0.0, 0.0))
                self._sums[(model, key)] = (
                    per_slot * keep + dispatched / state.slots,
                    seconds * keep + elapsed_ms / 1000,
                )


def _count(counts: Counter[tuple[str, str]], batches: Iterable[BatchDispatch]) -> None:
    for batch in batches:
        for request in batch.requests:
            counts[(batch.model, CLASS_KEYS[class_index(request)])] += 1


def saturation_report(
    batcher_id: str,
    started_ms: int,
    now_ms: int,
    load: Mapping[str, wire.QueueLoad],
    models: Mapping[str, wire.ModelLoad],
    catalogue: Collection[str],
    drain: Rates,
    backlog: Rates,
) -> wire.BatcherSaturation:
    """The report sent at ``now_ms`` by a batcher started at ``started_ms``; ``load``: all models together; ``models``:
    the policy's view of each, to which the drain rates are added."""
    total: Counter[str] = Counter()
    for by_class in drain.values():
        total.update(by_class)
    return wire.BatcherSaturation(
        batcher_id=batcher_id,
        sent_ms=now_ms,
        started_ms=started_ms,
        classes=_queues(load, total),
        models={
            name: msgspec.structs.replace(
                state,
                classes=_queues(state.classes, drain.get(name, {}), backlog.get(name, {})),
                capacity_per_s=round(state.capacity_per_s, 3),
            )
            for name, state in models.items()
            if name in catalogue or state.worker_seen_ms
        },
    )


def _queues(
    load: Mapping[str, wire.QueueLoad], drain: Mapping[str, float], backlog: Mapping[str, float] | None = None
) -> dict[str, wire.QueueLoad]:
    backlog = backlog or {}
    return {
        key: msgspec.structs.replace(
            c, drained_per_s=round(drain.get(key, 0.0), 3), backlog_drained_per_s=round(backlog.get(key, 0.0), 3)
        )
        for key, c in load.items()
    }

"""A stack in miniature for admission's unit tests, on an injected clock: one API pod deciding with the real
``merge_reports`` and ``ShedPolicy``, ``batchers`` batchers (requests in turn) measuring with the real ``DrainMeter``
and ``BacklogDrain`` and reporting with ``saturation_report`` every second (each at its own phase), and fixed-time
workers sharing the slots: each runs a window of its share every ``window_ms`` while work waits, taken across the
batchers' queues by class precedence, then arrival (an idle one starts GATHER_MS after a request arrives). A
request's wait is from its admission to the start of its window (what ``Timings.queued_ms`` measures, less the hops
this model leaves out); its unfinished count ends with its window. Time jumps from event to event (arrivals, windows,
reports), so ten idle minutes cost 600 reports."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace

from llmq_api.admission import Admitted, ShedPolicy, Unfinished, all_unfinished, merge_reports, prediction_verdict
from llmq_batcher.flights import BatchDispatch
from llmq_batcher.saturation import BacklogDrain, DrainMeter, saturation_report
from llmq_core import constants, wire
from llmq_core.clock import FakeClock
from llmq_core.constants import PRIORITY_CLASSES
from llmq_core.settings import Settings

MODEL = "llmq-sim"
REPORT_MS = constants.SATURATION_REPORT_INTERVAL_MS
STALE_MS = 5000
IDLE_MS = 1 << 62
GATHER_MS = 20  # an idle fleet's next window starts this long after a request arrives (the batcher's window)
_REQUEST = {  # PRIORITY_CLASSES entry -> what the batcher's class_index reads of a request
    key: SimpleNamespace(traffic_class=key.split(":")[0], tier=(key.split(":") + [constants.TIER_PAID])[1])
    for key in PRIORITY_CLASSES
}


@dataclass(slots=True)
class Served:
    """One admitted request: its class, its predicted wait and, once its window started, its measured wait (ms)."""

    cls: str
    admitted_ms: int
    predicted_ms: int
    seq: int = 0  # arrival order: the fleet takes a class's requests first come, first served, whichever batcher
    measured_ms: int | None = None
    end: Callable[[], None] = lambda: None


@dataclass
class Batcher:
    name: str
    phase_ms: int
    started_ms: int
    queues: dict[str, deque[Served]] = field(default_factory=lambda: {c: deque() for c in PRIORITY_CLASSES})
    drain: DrainMeter = field(init=False)
    backlog: BacklogDrain = field(init=False)

    def __post_init__(self) -> None:
        self.drain, self.backlog = DrainMeter(self.started_ms), BacklogDrain(self.started_ms)

    def report(self, now_ms: int, slots: int, capacity_per_s: float) -> wire.BatcherSaturation:
        classes = {
            c: wire.QueueLoad(depth=len(q), oldest_age_ms=now_ms - q[0].admitted_ms if q else 0)
            for c, q in self.queues.items()
        }
        load = wire.ModelLoad(
            classes=classes, workers=1, slots=slots, worker_seen_ms=now_ms, capacity_per_s=capacity_per_s
        )
        models = {MODEL: load}
        return saturation_report(
            self.name, self.started_ms, now_ms, {}, models, {MODEL},
            self.drain.rates(now_ms), self.backlog.rates(now_ms, models),
        )  # fmt: skip


@dataclass
class Worker:
    """A fixed-time worker: its next window starts at ``next_ms`` (idle: never, until work arrives)."""

    slots: int
    next_ms: int = IDLE_MS
    running: list[Served] = field(default_factory=list)


class Stack:
    """``workers`` fixed-time workers sharing ``slots``, each running a window of its share every ``window_ms`` while
    work waits (an idle one starts GATHER_MS after a request arrives): the fleet drains slots * 1000 / window_ms
    requests/s. One slot per worker approximates continuous batching. ``capacity_per_s``: what the heartbeats promise
    at a time (ms -> requests/s), which need not be the truth."""

    def __init__(
        self,
        slots: int,
        window_ms: int,
        *,
        workers: int = 1,
        batchers: int = 1,
        capacity_per_s: Callable[[int], float] | None = None,
        start_ms: int = 1_000_000,
    ) -> None:
        self.clock = FakeClock(start_ms)
        self.slots, self.window_ms = slots, window_ms
        self.capacity_per_s = capacity_per_s or (lambda now_ms: slots * 1000 / window_ms)
        self.policy = ShedPolicy.from_settings(
            Settings(api={"max_in_flight": 100_000}, batcher={"max_queued": 100_000})
        )
        self.batchers = [Batcher(f"b{i}", i * REPORT_MS // batchers, start_ms) for i in range(batchers)]
        self.reports: dict[str, wire.BatcherSaturation] = {}
        self.admitted, self.unfinished = Admitted(), Unfinished()
        self.served: list[Served] = []
        self.refused: list[tuple[str, int]] = []  # (class, predicted wait ms)
        self.workers = [Worker(slots // workers) for _ in range(workers)]
        self._next_report_ms = {b.name: start_ms + 1 + b.phase_ms for b in self.batchers}  # not on a burst's ms
        self._arrivals = 0
        self.advance(0)

    def arrive(self, cls: str) -> bool:
        """A request of ``cls`` now: admitted (queued at the next batcher in turn) or refused."""
        now_ms = self.clock.now_ms()
        unfinished = all_unfinished(self.unfinished.counts, (), now_ms, STALE_MS)
        sat = merge_reports(self.reports.values(), now_ms, STALE_MS, admitted=self.admitted, unfinished=unfinished)
        predicted = sat.predict(MODEL, cls)
        if self.policy.check(cls, MODEL, sat, 0) is not None:
            self.refused.append((cls, predicted.wait_ms))
            return False
        self.admitted.add(MODEL, cls, now_ms)
        served = Served(cls, now_ms, predicted.wait_ms, self._arrivals, end=self.unfinished.start(MODEL, cls))
        self.served.append(served)
        self.batchers[self._arrivals % len(self.batchers)].queues[cls].append(served)
        self._arrivals += 1
        idle = next((w for w in self.workers if w.next_ms == IDLE_MS), None)
        if idle is not None:  # an idle worker: a window soon
            idle.next_ms = now_ms + GATHER_MS
        return True

    def burst(self, cls: str, count: int, spread_ms: int = 0) -> int:
        """``count`` requests of ``cls`` at once, or evenly over ``spread_ms`` (as a client sends them); how many were
        admitted."""
        start, admitted = self.clock.now_ms(), 0
        for i in range(count):
            self.advance_to(start + i * spread_ms // count)
            admitted += self.arrive(cls)
        return admitted

    def load(self, rates: dict[str, float], seconds: float) -> None:
        """Poisson-free steady arrivals: ``rates`` (class -> requests/s) for ``seconds``, evenly interleaved."""
        arrivals = sorted(
            (i * 1000 / rate, cls) for cls, rate in rates.items() for i in range(int(rate * seconds))
        )  # fmt: skip
        start = self.clock.now_ms()
        for offset_ms, cls in arrivals:
            self.advance_to(start + int(offset_ms))
            self.arrive(cls)
        self.advance_to(start + int(seconds * 1000))

    def advance(self, ms: int) -> None:
        self.advance_to(self.clock.now_ms() + ms)

    def advance_to(self, until_ms: int) -> None:
        """Run windows and reports due up to ``until_ms``, in time order."""
        while True:
            report_ms, name = min((t, n) for n, t in self._next_report_ms.items())
            worker = min(self.workers, key=lambda w: w.next_ms)
            next_ms = min(worker.next_ms, report_ms)
            if next_ms > until_ms:
                break
            self.clock.set(max(next_ms, self.clock.now_ms()))
            if next_ms == worker.next_ms:
                self._window(worker)
            else:
                self._report(name)
        self.clock.set(max(until_ms, self.clock.now_ms()))

    def drain(self) -> None:
        """Run until every admitted request's window ended."""
        while any(w.next_ms < IDLE_MS for w in self.workers):
            self.advance(self.window_ms)

    def _window(self, worker: Worker) -> None:
        now_ms = self.clock.now_ms()
        for served in worker.running:
            served.end()
        worker.running = []
        heads = [(c, b) for c in PRIORITY_CLASSES for b in self.batchers]
        taken: dict[str, list[str]] = {b.name: [] for b in self.batchers}
        while len(worker.running) < worker.slots:
            ready = [(i, b.queues[c][0].seq, b) for i, (c, b) in enumerate(heads) if b.queues[c]]
            if not ready:
                break
            i, _, batcher = min(ready, key=lambda r: (PRIORITY_CLASSES.index(heads[r[0]][0]), r[1]))
            served = batcher.queues[heads[i][0]].popleft()
            served.measured_ms = now_ms - served.admitted_ms
            worker.running.append(served)
            taken[batcher.name].append(served.cls)
        for batcher in self.batchers:
            if taken[batcher.name]:
                batch = _dispatch(taken[batcher.name], now_ms)
                batcher.drain.dispatched([batch])
                batcher.backlog.dispatched([batch])
        worker.next_ms = now_ms + self.window_ms if worker.running else IDLE_MS

    def _report(self, name: str) -> None:
        now_ms = self.clock.now_ms()
        batcher = next(b for b in self.batchers if b.name == name)
        self.reports[name] = batcher.report(now_ms, self.slots, self.capacity_per_s(now_ms))
        self._next_report_ms[name] = now_ms + REPORT_MS

    def of(self, cls: str, since_ms: int = 0) -> list[Served]:
        """The admitted requests of ``cls`` admitted at or after ``since_ms``."""
        return [s for s in self.served if s.cls == cls and s.admitted_ms >= since_ms]


def _dispatch(classes: Iterable[str], now_ms: int) -> BatchDispatch:
    return BatchDispatch("batch", "w", 0, MODEL, [_REQUEST[c] for c in classes], "size", now_ms)


def within(predicted_ms: int, measured_ms: int) -> bool:
    """Issue 28's rule for one admitted request: |predicted - measured| <= max(0.5 x measured, 250 ms)."""
    return prediction_verdict(predicted_ms, measured_ms) == "within"


def share_within(served: list[Served]) -> float:
    """The share of ``served`` whose prediction was within the rule."""
    return sum(within(s.predicted_ms, s.measured_ms) for s in served) / len(served)


def share_late(served: list[Served], limit_ms: int) -> float:
    """The share of ``served`` that waited past ``limit_ms``."""
    return sum(s.measured_ms > limit_ms for s in served) / len(served)

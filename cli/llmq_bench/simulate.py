"""Discrete-event simulation of the batcher's policy in front of fixed-time batch workers (seed 003).

The SAME ``BatchPolicy`` the service runs decides every batch; only arrivals, workers and time are simulated. Time moves
in ticks of ``tick_ms`` (1 ms: the batcher likewise reads requests from Kafka in groups). Each tick: finished batches
report their results (``on_result``), workers heartbeat every ``heartbeat_interval_ms``, the tick's arrivals are added,
then ``schedule`` runs once and its batches reach their workers ``dispatch_delay_ms`` later. Deferred arrivals wait in
a backlog (the deferred topic) that is read, like the batcher's consumer does, only while the policy does not pause it.

Run: ``llmq simulate --rps 40000 --replicas 170 --duration-s 60``; a class mix:
``llmq simulate --rps 40 --replicas 2 --batch-time-ms 500 --mix interactive=0.8,near_interactive=0.15,deferred=0.05``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

import numpy as np

from llmq_batcher.ledger import WorkerLedger
from llmq_batcher.policy import CLASS_KEYS, BatchPolicy, PolicyConfig, class_index
from llmq_bench.batch_time import BatchTimeModel
from llmq_core import constants, wire

MODEL = "llmq-sim"
_REPLY = wire.HttpReply(instance_id="sim")
_SAMPLING = wire.SamplingParams(max_tokens=16)
CONSUME_MAX_RECORDS = 500  # deferred records taken in per tick, like one getmany of the batcher's consumer
DEFERRED_DEADLINE_MS = 3_600_000
GRANT_TTL_MS = 2_000  # a ledger grant's time in transit at most (a produce and a worker's fetch take ~ms here)


def parse_mix(text: str) -> dict[str, float]:
    """``interactive=0.8,near_interactive=0.15,deferred=0.05`` -> shares per traffic class (normalised to sum 1)."""
    mix = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        if name not in constants.TRAFFIC_CLASSES:
            raise ValueError(f"unknown traffic class {name!r}: one of {', '.join(constants.TRAFFIC_CLASSES)}")
        mix[name] = float(share)
    total = sum(mix.values())
    if total <= 0 or any(v < 0 for v in mix.values()):
        raise ValueError(f"class shares must be >= 0 and add up to more than 0: {text!r}")
    return {name: share / total for name, share in mix.items()}


@dataclass(slots=True)
class _Worker:
    """A fixed-time engine, as llmq-sim's: runs up to ``max_batch`` requests at a time for ``batch_time_ms``; requests
    that arrive meanwhile wait here, (dispatched_ms, request) in arrival order, whichever batch brought them."""

    worker_id: str
    partition: int
    busy_until_ms: int = 0
    running: list = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    last_batch_id: str = ""


def arrival_counts(
    rps: float,
    duration_s: float,
    tick_ms: int,
    pattern: str,
    rng: np.random.Generator,
    burst_factor: float = 3.0,
    burst_period_s: float = 10.0,
    burst_duty: float = 0.2,
) -> np.ndarray:
    """Requests arriving in each tick. ``poisson``: constant rate; ``bursty``: the rate is ``burst_factor`` times the
    base rate for the first ``burst_duty`` of every ``burst_period_s``, with the base chosen so the mean stays ``rps``."""
    ticks = int(duration_s * 1000 / tick_ms)
    per_tick = np.full(ticks, rps * tick_ms / 1000)
    if pattern == "bursty":
        base = 1 / (1 + burst_duty * (burst_factor - 1))
        phase = (np.arange(ticks) * tick_ms) % int(burst_period_s * 1000)
        per_tick *= np.where(phase < burst_duty * burst_period_s * 1000, base * burst_factor, base)
    elif pattern != "poisson":
        raise ValueError(f"unknown arrival pattern {pattern!r}")
    return rng.poisson(per_tick)


def run_simulation(
    rps: float,
    replicas: int,
    max_batch: int = 64,
    batch_time_ms: int = 250,
    duration_s: float = 60,
    *,
    pattern: str = "poisson",
    wait_ms: int = 20,
    deadline_ms: int = 5000,
    network_ms: int = 0,
    paid_share: float = 1.0,
    dispatch_delay_ms: int = 1,
    heartbeat_interval_ms: int = 250,
    tick_ms: int = 1,
    seed: int = 0,
    burst_factor: float = 3.0,
    mix: dict[str, float] | None = None,
    batchers: int = 1,
    shared_capacity: bool = False,
    leads_ms: tuple[int, ...] = (),
    margin_ms: int | None = None,
    batch_time: BatchTimeModel | None = None,
) -> dict:
    """Simulate ``duration_s`` of traffic at ``rps`` (``mix``: share per traffic class, all interactive by default;
    ``paid_share`` of it paid, the rest free) against ``replicas`` fixed-time workers (``max_batch`` requests per
    ``batch_time_ms`` batch); then let queued work finish. Deferred requests get a deadline of an hour, others
    ``deadline_ms``. ``batchers``: policies of one consumer group, each given the requests of its request partitions
    (a uniform share of arrivals) and every worker's heartbeats, and only its own batches' results.
    ``shared_capacity``: each batch claims its requests from its worker's ledger first (llmq_batcher.ledger);
    ``leads_ms``: the policy's fixed-engine class leads (PolicyConfig.fixed_engine_leads_ms); ``margin_ms``: a window's
    last claim before it starts (None: ``dispatch_delay_ms`` + 1). ``batch_time``: a window's time as a function of its
    requests' uncached prompt tokens (each request's header cached with the model's hit rate), replacing
    ``batch_time_ms``; workers declare the expected time of a full window as their fixed batch time (None: every
    window takes ``batch_time_ms``).

    Returns a dict: requests, completed, expired, throughput_rps (completed per simulated second of arrivals),
    latency_ms {p50, p99, mean, max} (arrival to batch end + ``network_ms``), the same per tier and per priority class,
    wait_ms_by_stage {batcher, worker} (arrival to dispatch; dispatch to start), deferred_backlog_max (deferred records
    left unread at most), mean_batch_fill (0..1), batches, flush reasons, mean_window_ms (engine time per window),
    worker utilization (0..1), wall_s and sim_speed (simulated / wall seconds).
    """
    started = time.perf_counter()
    model = batch_time or BatchTimeModel(fixed_ms=batch_time_ms)
    batch_time_ms = round(model.expected_batch_ms(max_batch))  # what a worker declares: a full window's time
    rng = np.random.default_rng(seed)
    counts = arrival_counts(rps, duration_s, tick_ms, pattern, rng, burst_factor=burst_factor)
    mix = mix or {constants.INTERACTIVE: 1.0}
    total = int(counts.sum())
    paid = rng.random(total) < paid_share
    classes = rng.choice(list(mix), size=total, p=list(mix.values()))
    config = PolicyConfig.defaults(
        "sim",
        fixed_engine_max_wait_ms=wait_ms,
        tenant_max_inflight=1 << 40,
        max_queued=1 << 40,
        model_max_batch={MODEL: max_batch},
        worker_heartbeat_timeout_ms=10 * heartbeat_interval_ms,
        fixed_engine_leads_ms=leads_ms,
    )
    policies = [BatchPolicy(replace(config, batch_id_prefix=f"sim{b}")) for b in range(batchers)]
    owners = rng.integers(batchers, size=total)
    workers = [_Worker(f"w{i}", i) for i in range(replicas)]
    sim = _Run(policies, workers, max_batch, batch_time_ms, dispatch_delay_ms, heartbeat_interval_ms)
    if not model.fixed:
        hits = rng.random(total) < model.prefix_hit_rate
        sim.model, sim.uncached = model, np.where(hits, model.uncached_tokens(True), model.uncached_tokens(False))
    if shared_capacity:
        sim.ledgers = {w.worker_id: WorkerLedger(max_batch, fixed=True, batch_time_ms=batch_time_ms) for w in workers}
        sim.lead_ms = max(leads_ms, default=0)
        sim.margin_ms = dispatch_delay_ms + 1 if margin_ms is None else margin_ms
    for worker in workers:
        sim.heartbeat(worker, 0)
    sim.run(counts, paid, classes, owners, tick_ms, deadline_ms)
    return sim.report(rps, duration_s, network_ms, time.perf_counter() - started)


class _Run:
    """One simulation's mutable state and event handling."""

    def __init__(
        self,
        policies: list[BatchPolicy],
        workers: list[_Worker],
        max_batch: int,
        batch_time_ms: int,
        dispatch_delay_ms: int,
        heartbeat_interval_ms: int,
    ) -> None:
        self.policies = policies
        self.wake_ms = [0] * len(policies)  # when each policy asked to be scheduled next
        self.owner: dict[str, int] = {}  # request_id -> the policy holding it
        self.now_ms = 0  # simulated time, epoch 0
        self.workers = workers
        self.by_id = {w.worker_id: w for w in workers}
        self.max_batch = max_batch
        self.batch_time_ms = batch_time_ms
        self.dispatch_delay_ms = dispatch_delay_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.events: list[tuple[int, int, int, object]] = []  # (time, kind, seq, payload): 0 finish, 1 delivery
        self.event_seq = 0
        self.latencies: dict[str, list[int]] = {key: [] for key in CLASS_KEYS}  # ms from arrival to batch end
        self.by_tier: dict[str, list[int]] = {tier: [] for tier in constants.TIERS}
        self.backlog: list[deque[wire.GenerationRequest]] = [deque() for _ in policies]  # deferred, unread
        self.backlog_max = 0
        self.batch_sizes: list[int] = []
        self.flushes: Counter[str] = Counter()
        self.expired = 0
        self.busy_ms = 0
        self.ledgers: dict[str, WorkerLedger] = {}  # shared capacity: worker_id -> its ledger
        self.lead_ms = 0  # the policies' largest class lead (their claims say it)
        self.margin_ms = 0  # a window's last claim before it starts
        self.windows: list[int] = []  # requests of each window a worker started
        self.window_ms: list[int] = []  # engine time of each window a worker started
        self.model: BatchTimeModel | None = None  # prefill mode: windows take the model's time
        self.uncached: np.ndarray | None = None  # prefill mode: uncached prompt tokens by request id
        self.batcher_waits: list[int] = []  # ms from arrival to dispatch, of each request a worker started
        self.worker_waits: list[int] = []  # ms from dispatch to its batch's start (dispatch delay included)

    def run(
        self,
        counts: np.ndarray,
        paid: np.ndarray,
        classes: np.ndarray,
        owners: np.ndarray,
        tick_ms: int,
        deadline_ms: int,
    ) -> None:
        next_id = 0
        t = 0
        tick = 0
        while tick < len(counts) or self.events or self._holding():
            self.now_ms = t
            arrived = [0] * len(self.policies)
            self._process_events(t)
            if t % self.heartbeat_interval_ms == 0:
                for worker in self.workers:
                    self.heartbeat(worker, t)
            n = int(counts[tick]) if tick < len(counts) else 0
            for i in range(next_id, next_id + n):
                deferred = classes[i] == constants.DEFERRED
                request = wire.GenerationRequest(
                    request_id=str(i),
                    traffic_class=str(classes[i]),
                    tier="paid" if paid[i] else "free",
                    model=MODEL,
                    prompt="x",
                    sampling=_SAMPLING,
                    created_ms=t,
                    deadline_ms=t + (DEFERRED_DEADLINE_MS if deferred else deadline_ms),
                    reply_to=_REPLY,
                    prompt_tokens=8,
                )
                b = int(owners[i])
                self.owner[request.request_id] = b
                arrived[b] += 1
                if deferred:
                    self.backlog[b].append(request)
                else:
                    self.policies[b].add(request, t)
            next_id += n
            soon = bool(self.events) and self.events[0][0] <= t + tick_ms
            for b in range(len(self.policies)):
                arrived[b] += self._read_deferred(b, t)
                if arrived[b] or self.wake_ms[b] <= t or soon:
                    self.wake_ms[b] = self._schedule(b, t)
            tick += 1
            t += tick_ms

    def _holding(self) -> bool:
        return any(p.queued_total for p in self.policies) or any(self.backlog)

    def _read_deferred(self, b: int, t: int) -> int:
        """Take in deferred records as the batcher's consumer does: up to one read's worth, unless the policy pauses."""
        backlog, policy = self.backlog[b], self.policies[b]
        self.backlog_max = max(self.backlog_max, len(backlog))
        if not backlog or policy.deferred_paused():
            return 0
        n = min(len(backlog), CONSUME_MAX_RECORDS)
        for _ in range(n):
            policy.add(backlog.popleft(), t)
        return n

    def _schedule(self, b: int, t: int) -> int:
        policy = self.policies[b]
        decision = policy.schedule(t)
        self.expired += len(decision.answers)
        for batch in decision.batches:
            if self.ledgers:
                ledger = self.ledgers[batch.worker_id]
                grant = ledger.claim(batch.batch_id, len(batch.requests), t, GRANT_TTL_MS, self.lead_ms, self.margin_ms)
                batch = policy.claimed(batch, grant)
                if batch is None:
                    continue
            self.batch_sizes.append(len(batch.requests))
            self.flushes[batch.flush_reason] += 1
            self._push(t + self.dispatch_delay_ms, 1, batch)
        return decision.next_wake_ms if decision.next_wake_ms is not None else 1 << 62

    def _process_events(self, t: int) -> None:
        events = self.events
        while events and events[0][0] <= t:
            at, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                self._finish(payload, at)
            else:
                worker = self.by_id[payload.worker_id]
                worker.waiting.extend((payload.formed_ms, r) for r in payload.requests)
                worker.last_batch_id = payload.batch_id
                if self.ledgers:
                    self.ledgers[worker.worker_id].took(payload.batch_id, len(worker.running), len(worker.waiting))
                if not worker.running:
                    self._start(worker, at)

    def _start(self, worker: _Worker, t: int) -> None:
        taken = [worker.waiting.popleft() for _ in range(min(self.max_batch, len(worker.waiting)))]
        self.batcher_waits += [sent_ms - r.created_ms for sent_ms, r in taken]
        self.worker_waits += [t - sent_ms for sent_ms, _ in taken]
        worker.running = [r for _, r in taken]
        self.windows.append(len(taken))
        window_ms = self._window_ms(worker.running)
        self.window_ms.append(window_ms)
        worker.busy_until_ms = t + window_ms
        if self.ledgers:
            self.ledgers[worker.worker_id].holds(len(worker.running), len(worker.waiting), worker.busy_until_ms)
        self.busy_ms += window_ms
        self._push(worker.busy_until_ms, 0, worker)

    def _window_ms(self, running: list[wire.GenerationRequest]) -> int:
        if self.model is None:
            return self.batch_time_ms
        tokens = sum(int(self.uncached[int(r.request_id)]) for r in running)
        return round(self.model.batch_ms(tokens))

    def _finish(self, worker: _Worker, t: int) -> None:
        policies, owner = self.policies, self.owner
        latencies, by_tier = self.latencies, self.by_tier
        for request in worker.running:
            policies[owner.pop(request.request_id)].on_result(request.request_id)
            latency = t - request.created_ms
            latencies[CLASS_KEYS[class_index(request)]].append(latency)
            by_tier[request.tier].append(latency)
        worker.running = []
        if worker.waiting:
            self._start(worker, t)
        elif self.ledgers:
            self.ledgers[worker.worker_id].holds(0, 0)

    def heartbeat(self, worker: _Worker, t: int) -> None:
        running = len(worker.running)
        queued = len(worker.waiting)
        drain = max(worker.busy_until_ms - t, 0) + math.ceil(queued / self.max_batch) * self.batch_time_ms
        beat = wire.WorkerHeartbeat(
            worker_id=worker.worker_id,
            partition=worker.partition,
            model=MODEL,
            max_slots=self.max_batch,
            running=running,
            queued=queued,
            free_slots=0 if running or queued else self.max_batch,
            est_drain_ms=drain,
            sent_ms=t,
            fixed_batch_time_ms=self.batch_time_ms,
            last_batch_id=worker.last_batch_id,
        )
        for policy in self.policies:  # every batcher hears every worker (one pub/sub channel)
            policy.on_heartbeat(beat, t)

    def _push(self, at: int, kind: int, payload: object) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (at, kind, self.event_seq, payload))

    def report(self, rps: float, duration_s: float, network_ms: int, wall_s: float) -> dict:
        classes = {key: np.asarray(values, dtype=np.int64) + network_ms for key, values in self.latencies.items()}
        latencies = np.concatenate(list(classes.values()))
        tiers = {tier: np.asarray(values, dtype=np.int64) + network_ms for tier, values in self.by_tier.items()}
        sim_s = self.now_ms / 1000
        return {
            "requests": len(latencies) + self.expired,
            "completed": len(latencies),
            "expired": self.expired,
            "throughput_rps": round(len(latencies) / duration_s, 1),
            "offered_rps": rps,
            "latency_ms": _percentiles(latencies),
            "latency_ms_by_tier": {tier: _percentiles(values) for tier, values in tiers.items() if len(values)},
            "latency_ms_by_class": {key: _percentiles(values) for key, values in classes.items() if len(values)},
            "completed_by_class": {key: len(values) for key, values in classes.items() if len(values)},
            "wait_ms_by_stage": {
                "batcher": _percentiles(np.asarray(self.batcher_waits, dtype=np.int64)),
                "worker": _percentiles(np.asarray(self.worker_waits, dtype=np.int64)),
            },
            "deferred_backlog_max": self.backlog_max,
            "mean_batch_fill": round(float(np.mean(self.batch_sizes)) / self.max_batch, 4) if self.batch_sizes else 0.0,
            "mean_window_fill": round(float(np.mean(self.windows)) / self.max_batch, 4) if self.windows else 0.0,
            "batches": len(self.batch_sizes),
            "mean_window_ms": round(float(np.mean(self.window_ms)), 1) if self.window_ms else 0.0,
            "flush": dict(self.flushes),
            "utilization": round(self.busy_ms / (len(self.workers) * max(sim_s, 1e-9) * 1000), 4),
            "wall_s": round(wall_s, 2),
            "sim_speed": round(sim_s / wall_s, 2),
        }


def _percentiles(values: np.ndarray) -> dict:
    if not len(values):
        return {"p50": None, "p99": None, "mean": None, "max": None}
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "mean": round(float(values.mean()), 1), "max": int(values.max())}

"""The models the batching policy has seen and the live workers serving them: heartbeats in, silent workers out.

A :class:`ModelState` holds one model's class queues (fairshare.py), its pool of live workers (workers.py) and the
times its batches wait for; :class:`Fleet` keeps them by name, the workers by id and when each would be silent too long,
and reports their load. Pure, like the policy: time enters only as ``now_ms``.
"""

from __future__ import annotations

import heapq

from llmq_batcher.classes import CLASS_KEYS, DEFERRED
from llmq_batcher.entries import Entry
from llmq_batcher.fairshare import FairQueue
from llmq_batcher.prefix_index import PrefixIndex
from llmq_batcher.workers import LeadSteps, WorkerPool, WorkerView
from llmq_core import wire


class ModelState:
    """One model: a FairQueue per CLASS_KEYS entry, its live workers, the last heartbeat of one (epoch ms)."""

    __slots__ = ("name", "queues", "pool", "worker_seen_ms", "hold_until_ms", "busy_until_ms")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queues = [FairQueue() for _ in CLASS_KEYS]
        self.pool = WorkerPool()
        self.worker_seen_ms = 0
        self.hold_until_ms = 0  # no batches before then: producing them failed for a transient reason
        self.busy_until_ms = 0  # when the last batch sent to one of its fixed-time workers ends, as predicted

    def depth(self) -> int:
        return sum(q.depth for q in self.queues)


class Fleet:
    """Models by name and live workers by id. A worker unheard for ``heartbeat_timeout_ms`` is silent: :meth:`expire`
    removes it. ``steps``: when batches go ahead of fixed-time workers' windows (see workers.py). ``prefixes``: what the
    live workers' caches hold (a removed worker is forgotten there)."""

    def __init__(
        self, heartbeat_timeout_ms: int, steps: LeadSteps | None = None, prefixes: PrefixIndex | None = None
    ) -> None:
        self.models: dict[str, ModelState] = {}
        self._steps = steps
        self.prefixes = prefixes if prefixes is not None else PrefixIndex(heartbeat_timeout_ms)
        self.workers: dict[str, WorkerView] = {}
        self._timeout_ms = heartbeat_timeout_ms
        self._liveness: list[tuple[int, str]] = []  # (expires_ms, worker_id), lazy

    def model(self, name: str) -> ModelState:
        """The state of model ``name``, created on first sight (in a request or a heartbeat)."""
        model = self.models.get(name)
        if model is None:
            model = self.models[name] = ModelState(name)
        return model

    def touch(self, worker: WorkerView) -> None:
        """Re-rank ``worker`` in its model's pool after its capacity changed."""
        self.model(worker.model).pool.touch(worker)

    def heartbeat(self, hb: wire.WorkerHeartbeat, now_ms: int) -> tuple[list[Entry], list[Entry]]:
        """Learn a worker's capacity from a heartbeat received at ``now_ms``; a new worker joins its model's pool, one
        that changed model or partition rejoins. Returns (orphaned, finished): what the worker held before it moved (to
        re-queue) and what the heartbeat shows finished (to release)."""
        worker = self.workers.get(hb.worker_id)
        orphaned: list[Entry] = []
        if worker is not None and (worker.model != hb.model or worker.partition != hb.partition):
            orphaned = self.remove(worker)
            worker = None
        if worker is None:
            worker = self.workers[hb.worker_id] = WorkerView(hb, self._steps)
            self.model(hb.model).pool.add(worker)
        finished = worker.held() if worker.apply_heartbeat(hb, now_ms, self._timeout_ms) else []
        model = self.model(hb.model)
        model.pool.touch(worker)
        model.worker_seen_ms = now_ms
        heapq.heappush(self._liveness, (now_ms + self._timeout_ms + 1, hb.worker_id))
        return orphaned, finished

    def expire(self, now_ms: int) -> list[list[Entry]]:
        """Remove the workers silent at ``now_ms``; returns what each held, one list per worker, in removal order."""
        self.prefixes.expire(now_ms)
        liveness, held = self._liveness, []
        while liveness and liveness[0][0] <= now_ms:
            _, worker_id = heapq.heappop(liveness)
            worker = self.workers.get(worker_id)
            if worker is not None and worker.last_heard_ms + self._timeout_ms < now_ms:
                held.append(self.remove(worker))
        return held

    def remove(self, worker: WorkerView) -> list[Entry]:
        """Forget ``worker``; returns the entries it holds that are not known finished."""
        self.workers.pop(worker.worker_id, None)
        self.model(worker.model).pool.remove(worker)
        self.prefixes.forget(worker.worker_id)
        return worker.held()

    def next_expiry_ms(self) -> int | None:
        """When a worker may next fall silent (call :meth:`expire` then), if any is live."""
        return self._liveness[0][0] if self._liveness else None

    def load(self, now_ms: int) -> dict[str, wire.QueueLoad]:
        """Queue depth and oldest queued age (ms) per class, over all models."""
        out = {}
        for index, key in enumerate(CLASS_KEYS):
            depth, oldest = 0, now_ms
            for model in self.models.values():
                queue = model.queues[index]
                if queue.depth:
                    depth += queue.depth
                    oldest = min(oldest, queue.oldest_enqueued_ms() or now_ms)
            out[key] = wire.QueueLoad(depth=depth, oldest_age_ms=now_ms - oldest)
        return out

    def model_states(self, now_ms: int) -> dict[str, wire.ModelLoad]:
        """Every model seen -> its queues, live workers, their slots and capacity, and last worker heartbeat."""
        return {
            model.name: wire.ModelLoad(
                classes={
                    key: wire.QueueLoad(
                        depth=q.depth, oldest_age_ms=now_ms - (q.oldest_enqueued_ms() or now_ms) if q.depth else 0
                    )
                    for key, q in zip(CLASS_KEYS, model.queues)
                },
                workers=len(model.pool.workers),
                slots=sum(w.max_slots for w in model.pool.workers.values()),
                worker_seen_ms=model.worker_seen_ms,
                capacity_per_s=sum(w.capacity_per_s() for w in model.pool.workers.values()),
            )
            for model in self.models.values()
        }

    def deferred_paused(self, reserved_share: float, buffer_rounds: int) -> bool:
        """True once the deferred work queued for models with live workers reaches ``buffer_rounds`` times the slots
        above the reserve (``reserved_share`` of each worker's) of those workers."""
        queued, room = 0, 0
        for model in self.models.values():
            workers = model.pool.workers.values()
            if workers:
                queued += model.queues[DEFERRED].depth
                room += sum(w.max_slots - w.reserved_slots(reserved_share) for w in workers)
        return queued >= room * buffer_rounds

"""A continuous-batching engine's own queue (the transformers engine's): the jobs whose sequences are not in its
generation loop's manager (new or preempted), each round's plan of what to preempt and what to admit
(:mod:`llmq_worker.preemption`'s rules) as plain data, and :class:`QueueingEngine`, which carries the plan out."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Protocol

from llmq_core.metrics import PreemptionStats
from llmq_core.telemetry import request_fields
from llmq_worker import preemption
from llmq_worker.engine import Capacity, SequenceEngine

log = logging.getLogger(__name__)


class QueuedJob(Protocol):
    """What the queue reads of an engine job."""

    order: int

    def view(self) -> preemption.JobView: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """One round: preempt ``victims`` (making room for ``cause``: a traffic class), then admit ``admit`` in order."""

    victims: list
    admit: list
    cause: str = ""


class JobQueue:
    """Waiting jobs of an engine with ``max_sequences`` slots, and its preemption limits (``max_preemptions``: 0
    never; ``min_slack_ms``); ``stats`` counts preemptions and resumes for the worker's metrics."""

    def __init__(self, max_sequences: int, max_preemptions: int, min_slack_ms: int) -> None:
        self.waiting: list = []
        self.stats = PreemptionStats()
        self._max_sequences = max_sequences
        self._max_preemptions = max_preemptions
        self._min_slack_ms = min_slack_ms
        self._arrivals = itertools.count()

    def arrive(self, job: QueuedJob) -> None:
        job.order = next(self._arrivals)
        self.waiting.append(job)

    def discard(self, job: QueuedJob) -> None:
        if job in self.waiting:
            self.waiting.remove(job)

    def plan(self, admitted: list, now_ms: int, tokens_per_s: float) -> Plan:
        """Given the ``admitted`` jobs (their sequences in the manager) and the engine's rate: the deferred jobs to
        preempt for waiting people, then the waiting jobs to admit, in admission order while their sequences fit (one
        too big for every slot runs alone). A job preempted this round is not admitted in it."""
        running = {view.request_id: (view, job) for job in admitted for view in [job.view()]}
        waiting = {view.request_id: (view, job) for job in self.waiting for view in [job.view()]}
        in_manager = sum(view.sequences for view, _ in running.values())
        order = preemption.admission_order([view for view, _ in waiting.values()])
        limits = self._limits(in_manager, tokens_per_s)
        running_views = [view for view, _ in running.values()]
        victim_ids = preemption.choose_victims(running_views, order, self._max_sequences - in_manager, now_ms, **limits)
        in_manager -= sum(running[i][0].sequences for i in victim_ids)
        admit = []
        for view in order:
            if in_manager and in_manager + view.sequences > self._max_sequences:
                break
            admit.append(waiting[view.request_id][1])
            in_manager += view.sequences
        return Plan([running[i][1] for i in victim_ids], admit, order[0].traffic_class if victim_ids else "")

    def preemptible(self, admitted: list, now_ms: int, tokens_per_s: float) -> int:
        """Sequences of the ``admitted`` jobs it would preempt now for people's work."""
        views = [job.view() for job in admitted]
        limits = self._limits(sum(v.sequences for v in views), tokens_per_s)
        return preemption.preemptible_sequences(views, now_ms, **limits)

    def _limits(self, in_manager: int, tokens_per_s: float) -> dict:
        running = max(min(in_manager, self._max_sequences), 1)
        return {
            "ms_per_token": 1000 * running / tokens_per_s if tokens_per_s > 0 else 0.0,
            "max_preemptions": self._max_preemptions,
            "min_slack_ms": self._min_slack_ms,
        }


class QueueingEngine(SequenceEngine):
    """A continuous-batching engine that queues what exceeds its slots itself (:class:`JobQueue`) and preempts for
    people's work. Its jobs have ``admitted``, ``preemptions``, ``prompt_tokens``, ``live_subs()`` (each with
    ``resumed`` and ``preempt()``) and ``view()``; a subclass implements the manager's side: ``_ensure_manager``,
    ``_add`` (False: the manager refused), ``_withdraw``, ``_retire``, ``_fail``, ``_end_sub`` and ``_forget_prefix``."""

    def _init_queue(self, max_preemptions: int, min_slack_ms: int) -> None:
        self._waitlist = JobQueue(self._max_sequences, max_preemptions, min_slack_ms)
        self.preemption_stats = self._waitlist.stats  # llmq_core.metrics reads it
        self._scheduling = False

    def cancel(self, request_id: str) -> None:
        super().cancel(request_id)
        self._schedule()

    def capacity(self) -> Capacity:
        """As :meth:`SequenceEngine.capacity`, with the running deferred sequences it would preempt now."""
        room = self._waitlist.preemptible(self._admitted(), self._clock.now_ms(), self._rate.tokens_per_s)
        return dataclasses.replace(super().capacity(), preemptible=room)

    def _enqueue(self, job) -> None:
        self._waitlist.arrive(job)
        self._schedule()

    def _schedule(self) -> None:
        """Carry out the queue's plans (:meth:`JobQueue.plan`) until one has nothing to do: a failure while admitting
        (a dying manager fails what it held) frees room the next plan fills. Re-entrant calls return: the outer call
        goes on."""
        if self._scheduling:
            return
        self._scheduling = True
        try:
            while self._waitlist.waiting:
                plan = self._waitlist.plan(self._admitted(), self._clock.now_ms(), self._rate.tokens_per_s)
                if not plan.victims and not plan.admit:
                    return
                for job in plan.victims:
                    self._preempt(job, plan.cause)
                for job in plan.admit:
                    if job in self._waitlist.waiting:  # not failed while an earlier one was admitted
                        self._waitlist.discard(job)
                        self._admit(job)
        finally:
            self._scheduling = False

    def _admitted(self) -> list:
        return [job for job in self._jobs.values() if job.admitted]

    def _admit(self, job) -> bool:
        """Put ``job``'s live sequences in the manager; a manager that refuses is dying: fail what it held, then one
        try on a fresh one, then fail the job. Returns whether it was admitted."""
        for _ in range(2):
            self._ensure_manager()
            if self._add(job):
                job.admitted = True
                if job.preemptions:  # a resume: its prompt and the ids generated so far are prefilled again
                    subs = job.live_subs()
                    self.preemption_stats.resumed(job.prompt_tokens * len(subs) + sum(len(s.resumed) for s in subs))
                return True
            self._retire("the generation loop stopped accepting requests")
        self._fail(job, "the generation loop is not accepting requests")
        return False

    def _preempt(self, job, cause: str) -> None:
        """Take ``job``'s sequences out of the manager, keeping their ids, and queue it again (at its arrival rank).
        ``cause``: the traffic class it made room for (the metric's label)."""
        subs = job.live_subs()
        self._withdraw(job)
        job.cached_tokens = self._forget_prefix(job)
        for sub in subs:
            sub.preempt()
        job.admitted = False
        job.preemptions += 1
        self.preemption_stats.preempted(cause)
        for sub in subs:
            if sub.over:  # its last token was in before the preemption, its end not yet
                self._end_sub(job, sub)
        if self._jobs.get(job.request.request_id) is job:
            self._waitlist.waiting.append(job)
        log.info(
            "preempted for %s work (%d so far)",
            cause,
            job.preemptions,
            extra=request_fields(job.request.request_id, job.request.traceparent),
        )

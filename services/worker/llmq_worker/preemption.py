"""Which running deferred sequences a continuous-batching engine preempts for people's work, and in what order it
admits what waits: pure rules, clock-free (times are arguments).

An engine runs at most its slots of sequences; the rest wait in its own queue (:func:`admission_order`: interactive,
then near-interactive, then deferred, each oldest first, a preempted job keeping its place). When interactive or
near-interactive sequences wait and no slot is free, :func:`choose_victims` names deferred jobs to preempt: the engine
stops their sequences, keeps the token ids they generated, and puts them back in its queue; admitted again, each
resumes from those ids (its prompt + ids prefilled: the only tokens recomputed) as a continuation does
(:mod:`llmq_worker.engine`). A job is preemptible when it is deferred, can cross a seam
(:func:`llmq_core.continuation.resumable`: no structured outputs, no logprobs), was preempted fewer than
``max_preemptions`` times, and its deadline leaves ``min_slack_ms`` beyond the time its tokens left take at the
engine's current per-sequence rate (an unmeasured rate counts as no time): preemption never makes it miss its deadline.
Interactive and near-interactive work is never preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmq_core.constants import DEFERRED, TRAFFIC_CLASSES


@dataclass(frozen=True, slots=True)
class JobView:
    """What the rules read of one job: ``sequences`` it runs (or would run), ``generated`` tokens so far (what a
    resume recomputes), ``tokens_left`` to its max_tokens, ``order``: its arrival rank at the engine."""

    request_id: str
    traffic_class: str
    sequences: int
    generated: int
    tokens_left: int
    deadline_ms: int
    preemptions: int
    resumable: bool
    order: int


def admission_order(waiting: list[JobView]) -> list[JobView]:
    """``waiting`` in the order the engine admits it: class precedence (TRAFFIC_CLASSES), then arrival."""
    rank = {c: i for i, c in enumerate(TRAFFIC_CLASSES)}
    return sorted(waiting, key=lambda j: (rank.get(j.traffic_class, len(rank)), j.order))


def preemptible(job: JobView, now_ms: int, ms_per_token: float, max_preemptions: int, min_slack_ms: int) -> bool:
    """Whether ``job`` may be preempted now (see the module docstring); ``ms_per_token``: one sequence's time per
    generated token at the engine's current rate (0: unmeasured)."""
    if job.traffic_class != DEFERRED or not job.resumable or job.preemptions >= max_preemptions:
        return False
    return job.deadline_ms - now_ms >= min_slack_ms + job.tokens_left * ms_per_token


def choose_victims(
    running: list[JobView],
    waiting: list[JobView],
    free_sequences: int,
    now_ms: int,
    *,
    ms_per_token: float,
    max_preemptions: int,
    min_slack_ms: int,
) -> list[str]:
    """The request ids of the running jobs to preempt so that the interactive and near-interactive sequences in
    ``waiting`` fit beside ``free_sequences`` free slots: preemptible jobs preempted the fewest times so far first,
    then those with the fewest generated tokens (the least recompute), the latest deadline breaking ties; as few as
    fill the need, none when nothing urgent waits. Fewest preemptions first spreads a worker's preemptions over its
    deferred jobs: the engine resumes the oldest waiting job first, so by generated tokens alone the job just resumed
    was the next victim again, spending its preemptions while a younger one sat waiting with all of its own, until no
    running job could make room for people (bench/bench_preemption.py: 7 of 8 arrivals preempted, the eighth waited)."""
    need = sum(j.sequences for j in waiting if j.traffic_class != DEFERRED) - free_sequences
    if need <= 0:
        return []
    candidates = [j for j in running if preemptible(j, now_ms, ms_per_token, max_preemptions, min_slack_ms)]
    victims: list[str] = []
    for job in sorted(candidates, key=lambda j: (j.preemptions, j.generated, -j.deadline_ms, -j.order)):
        if need <= 0:
            break
        victims.append(job.request_id)
        need -= job.sequences
    return victims


def preemptible_sequences(
    running: list[JobView], now_ms: int, *, ms_per_token: float, max_preemptions: int, min_slack_ms: int
) -> int:
    """Sequences of ``running`` that could be preempted now: the room an engine reports for urgent work."""
    return sum(j.sequences for j in running if preemptible(j, now_ms, ms_per_token, max_preemptions, min_slack_ms))

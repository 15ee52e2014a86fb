"""People's prompts in steps of their own: a scheduler for transformers' ContinuousBatchingManager.

The library's FIFO scheduler fills each step with every running sequence's next token, then with prompts to prefill.
A step that prefills a prompt beside decoding sequences leaves the library's decode fast path: every sequence of the
step goes through its variable-length attention, which reads the KV of the whole step. So the first token of an
interactive request that preempted deferred work came one step later than on an idle engine and its prefill step
took longer, by the deferred sequences' share (bench/bench_preemption.py, smollm2-135m-instruct on CPU: a 153-token
prompt's step took 954 ms beside three deferred decodes, 793 ms alone).

:class:`PeopleFirstScheduler` is that FIFO scheduler but for one rule: while the prompt of an interactive or
near-interactive sequence (a manager request id in :data:`PEOPLE`) waits to be prefilled, a step holds only people's
sequences; deferred ones, their resumed prompts included, wait for the next step. When nothing of people's fits
(the cache is short), the step is FIFO's, so no step is left empty by the rule.

:data:`PEOPLE` is written by the engine on the event loop's thread and read here in the manager's thread, with
single set operations (atomic under the GIL).
"""

from __future__ import annotations

from transformers.generation.continuous_batching import scheduler as cb_scheduler
from transformers.generation.continuous_batching.requests import RequestStatus

PEOPLE: set[str] = set()  # manager request ids of interactive and near-interactive sequences
NAME = "llmq_people_first"  # the config's scheduler_type


class PeopleFirstScheduler(cb_scheduler.FIFOScheduler):
    """FIFO's steps, but a step with a person's prompt to prefill holds people's sequences only (module docstring)."""

    def schedule_batch(self, token_budget: int, cache_budget: int):
        decoding = [s for s in self.active_requests.values() if s.status == RequestStatus.DECODING]
        prefilling = [s for s in self.active_requests.values() if s.status == RequestStatus.PREFILLING]
        if not self.block_new_requests:
            prefilling.extend(self._get_waiting_candidates())
        removed: set[str] = set()
        scheduled = None
        if any(s.request_id in PEOPLE for s in prefilling):
            people = [s for s in decoding + prefilling if s.request_id in PEOPLE]
            scheduled = self._process_candidates(people, token_budget, cache_budget, removed)
        if not scheduled or not scheduled[0]:
            scheduled = self._process_candidates(decoding + prefilling, token_budget, cache_budget, removed)
        requests, one_allocation_failed, decode_fast_path, num_q_tokens, max_kv_read = scheduled
        self._cleanup_waiting_queue(removed)
        if not requests and one_allocation_failed:
            return None, decode_fast_path, 0, 0  # the cache is full: the manager offloads, as after FIFO's
        return requests, decode_fast_path, num_q_tokens, max_kv_read


def install() -> None:
    """Make :data:`NAME` a scheduler type the library knows (idempotent)."""
    cb_scheduler.SCHEDULER_MAPPING[NAME] = PeopleFirstScheduler

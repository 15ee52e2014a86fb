"""Logprobs for transformers' ContinuousBatchingManager: the log probabilities of each generated token and of the
MAX_TOP_LOGPROBS most likely tokens at its position, under the model (before logit_bias, temperature and top-p, as
vLLM's default ``raw_logprobs``).

The manager's own ``return_logprobs`` reports the chosen token's probability after the processors, which after the
engine's :class:`~llmq_worker.engines.cb_processors.Draw` is always 1, and has no alternatives. So two processors of
the engine's own kind do it (:func:`install`): :class:`RawLogprobs` (first) keeps each step's log-softmax of the raw
logits; :class:`RecordLogprobs` (last) writes the chosen token (the one Draw left possible), its log probability and the
top ones into a table of ``2 * rows + 1`` lines on the device, each row of a request that asked to a line of one half
(halves alternate by step: with two steps in flight, the one being read is never the one being written; rows that did
not ask go to the last line). Both read only tensors (no Python branching on tensor data), so they also run inside
captured CUDA graphs; on a CPU a step where no row asked skips them.

Each request that asked gets its ``update_and_check_completion`` wrapped: when the manager hands it its new token (in
the generation thread, after the step's outputs are on the host) the wrapper reads its line of that step and passes
``(logprob, [(id, logprob), ...])`` as the token's logprob, so the manager keeps it in ``GenerationOutput.logprobs``,
aligned with ``generated_tokens``. A step's update follows its own preparation (synchronous batching) or the next
step's (async batching): the step read is the latest prepared one, less one when the manager runs async. (The one
exception: an async manager's very last update, when its loop stops, follows no preparation; the requests it holds end
errored then anyway, and a token whose line is not found gets the UNKNOWN entry, logged, rather than another's.)
Untested on a GPU so far (CUDA graphs, async batching): ``test_each_update_reads_the_logprobs_of_its_own_step...``
replays the manager's order of calls on a CPU.
"""

from __future__ import annotations

import collections
import functools
import logging

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

from llmq_core.constants import MAX_TOP_LOGPROBS

log = logging.getLogger(__name__)

KWARG = "logprobs"  # a request's alternatives per token (int); absent: no logprobs
_PENDING = "_llmq_logprob_lines"  # on a RequestState: deque of (step, line, alternatives) not read yet
# A token whose line was lost (never expected; logged): its entry says so instead of shifting the rest (JSON has no NaN)
UNKNOWN = (-9999.0, ())


class LogprobTable:
    """The device table both processors share, and the host side that reads it back per request."""

    def __init__(self, manager, rows: int, device: torch.device) -> None:
        self._manager = manager
        self._rows = rows
        self._empty = 2 * rows
        self.ids = torch.zeros((2 * rows + 1, 1 + MAX_TOP_LOGPROBS), dtype=torch.int64, device=device)
        self.values = torch.zeros((2 * rows + 1, 1 + MAX_TOP_LOGPROBS), dtype=torch.float32, device=device)
        self.any = True  # a row of the step being prepared asked
        self.raw: torch.Tensor | None = None  # this step's log-softmax, between the two processors
        self.lines: torch.Tensor | None = None
        self._prepared = 0  # steps prepared so far
        self._host: tuple[int, list, list] | None = None  # (step, ids, values) of one half, read back

    def prepare(self, requests_with_new_token) -> torch.Tensor:
        """The line of each row of the step being prepared; registers it with each request that asked."""
        step, self._prepared = self._prepared, self._prepared + 1
        base = (step % 2) * self._rows
        lines = []
        for i, future in enumerate(requests_with_new_token):
            alternatives = future.state.logit_processor_kwargs.get(KWARG)
            if alternatives is None or i >= self._rows:
                lines.append(self._empty)
                continue
            self._pending(future.state).append((step, base + i, alternatives))
            lines.append(base + i)
        self.any = len(lines) > 0 and min(lines) < self._empty
        lines += [self._empty] * (self._rows - len(lines))  # padded rows (CUDA graphs) write to the unused line
        return torch.tensor(lines, dtype=torch.int32)

    def _pending(self, state) -> collections.deque:
        pending = getattr(state, _PENDING, None)
        if pending is None:
            pending = collections.deque()
            setattr(state, _PENDING, pending)
            state.update_and_check_completion = functools.partial(
                self._update, state, state.update_and_check_completion
            )
        return pending

    def _update(self, state, update, token_id: int, logprob) -> bool:
        lag = 1 if getattr(self._manager.batch_processor, "use_async_batching", False) else 0
        step = self._prepared - 1 - lag
        pending = getattr(state, _PENDING)
        while pending and pending[0][0] < step:  # a step the manager skipped this request in (async)
            pending.popleft()
        raw = UNKNOWN
        if pending and pending[0][0] == step:
            _, line, alternatives = pending.popleft()
            raw = self._read(step, line, token_id, alternatives)
        else:
            log.error("no logprobs of step %d for %s", step, state.request_id)
        return update(token_id, raw)

    def _read(self, step: int, line: int, token_id: int, alternatives: int) -> tuple:
        base = (step % 2) * self._rows
        if self._host is None or self._host[0] != step:
            half = slice(base, base + self._rows)
            self._host = (step, self.ids[half].tolist(), self.values[half].tolist())
        ids, values = self._host[1][line - base], self._host[2][line - base]
        if ids[0] != token_id:
            log.error("logprob line of step %d holds token %d, not %d", step, ids[0], token_id)
            return UNKNOWN
        top = [(ids[1 + j], values[1 + j]) for j in range(alternatives)]
        return values[0], top

    def record(self, scores: torch.Tensor) -> None:
        """Write each row's chosen token (``scores``: Draw's, 0 there and -inf elsewhere) with the raw logprobs."""
        raw, lines = self.raw, self.lines
        token = scores.argmax(dim=-1, keepdim=True)
        top_values, top_ids = raw.topk(MAX_TOP_LOGPROBS, dim=-1)
        self.ids.index_copy_(0, lines, torch.cat([token, top_ids], dim=-1))
        self.values.index_copy_(0, lines, torch.cat([raw.gather(-1, token), top_values], dim=-1))


class RawLogprobs(ContinuousBatchingLogitsProcessor):
    """First processor: keeps the step's raw log-softmax and the rows' lines (kwarg ``logprobs``: alternatives)."""

    supported_kwargs: dict[str, type] = {KWARG: int}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, table: LogprobTable) -> None:
        self._table = table

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(self._table.ids.size(0) - 1)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return self._table.prepare(requests_with_new_token)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        table = self._table
        if not table.any and scores.device.type == "cpu":  # no graph capture on a CPU: skip the work
            table.raw = None
            return scores
        table.raw = scores.float().log_softmax(dim=-1)
        table.lines = tensor_arg[: scores.size(0)].long().clamp(0, table.ids.size(0) - 1)
        return scores


class RecordLogprobs(ContinuousBatchingLogitsProcessor):
    """Last processor: writes the rows' lines of the table (see :meth:`LogprobTable.record`)."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, table: LogprobTable) -> None:
        self._table = table

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if self._table.raw is not None:
            self._table.record(scores)
        return scores


def processors(manager) -> tuple[RawLogprobs, RecordLogprobs]:
    """The pair for ``manager`` (not started yet): the first goes before every other processor, the second after."""
    config = manager.continuous_batching_config
    table = LogprobTable(manager, config.max_requests_per_batch, manager.model.device)
    return RawLogprobs(table), RecordLogprobs(table)

"""Per-request ``logit_bias`` and ``seed`` for transformers' ContinuousBatchingManager, as logits processors of its own kind.

The manager samples every row of a step with one ``torch.multinomial`` on the global generator, and its per-request
processors only know temperature, top-k and top-p. :func:`install` adds two more to a manager before it starts:

- :class:`LogitBias` (first): adds a request's biases to its row's logits, before temperature, top-k and top-p.
- :class:`SeededSampling` (last): a seeded request draws its token itself, by inverse CDF on the final distribution with
  a uniform number from its own ``random.Random``, and leaves only that token possible, so the manager's multinomial
  must pick it. The k-th token of a request uses its k-th draw whatever else runs: a request run alone reproduces exactly;
  in a mixed batch its logits may differ in the last bits (other batch shapes), so there it is best effort.

Both read only their tensor argument and tensors they own (no Python branching on data), so they also work when the
manager captures its steps in CUDA graphs or runs two steps in flight (the bias rows alternate between two halves).
"""

from __future__ import annotations

import random

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

from llmq_core.constants import MAX_LOGIT_BIAS_TOKENS

UNSEEDED = -1.0  # the uniform draw of a row without a seed


class LogitBias(ContinuousBatchingLogitsProcessor):
    """Per-request ``logit_bias`` (kwarg: a tuple of (token id, bias) pairs). Each step writes the biased rows into one
    half of a table of ``2 * rows + 1`` lines (the last one stays empty) and passes each row its line index."""

    supported_kwargs: dict[str, type] = {"logit_bias": tuple}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, rows: int, device: torch.device) -> None:
        """``rows``: the most rows one step samples (the manager's max_requests_per_batch)."""
        self._rows = rows
        self._empty = 2 * rows
        self._ids = torch.zeros((2 * rows + 1, MAX_LOGIT_BIAS_TOKENS), dtype=torch.int64, device=device)
        self._values = torch.zeros((2 * rows + 1, MAX_LOGIT_BIAS_TOKENS), dtype=torch.float32, device=device)
        self._half = 0

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(self._empty)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        base, self._half = self._half * self._rows, 1 - self._half
        lines = []
        for i, request in enumerate(requests_with_new_token):
            pairs = request.state.logit_processor_kwargs.get("logit_bias")
            if not pairs or i >= self._rows:
                lines.append(self._empty)
                continue
            line = base + i
            ids, values = zip(*pairs)
            self._ids[line].zero_()
            self._values[line].zero_()
            self._ids[line, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
            self._values[line, : len(values)] = torch.tensor(values, dtype=torch.float32)
            lines.append(line)
        return torch.tensor(lines, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # Padded rows (CUDA graphs) hold stale indices: clamp them into the table.
        lines = tensor_arg[: scores.size(0)].long().clamp(0, self._empty)
        return scores.scatter_add(-1, self._ids[lines], self._values[lines])


class SeededSampling(ContinuousBatchingLogitsProcessor):
    """Per-request ``seed_rng`` (kwarg: a ``random.Random``): one uniform draw per sampled token of that request."""

    supported_kwargs: dict[str, type] = {"seed_rng": random.Random}
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(torch.full_like(int32_tensor, UNSEEDED, dtype=torch.float32).view(torch.int32))

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        draws = []
        for request in requests_with_new_token:
            rng = request.state.logit_processor_kwargs.get("seed_rng")
            draws.append(rng.random() if rng is not None else UNSEEDED)
        return torch.tensor(draws, dtype=torch.float32).view(torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return seeded_choice(scores, tensor_arg[: scores.size(0)].view(torch.float32))


def seeded_choice(scores: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Rows with a draw ``u`` in [0, 1) become 0 at the token whose CDF interval holds ``u`` and -inf elsewhere; other
    rows (u < 0, or NaN in padding) are returned unchanged. ``scores``: [rows, vocab] logits; ``draws``: [rows]."""
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    target = (draws.clamp(0, 1) * cdf[:, -1]).unsqueeze(-1)
    token = torch.searchsorted(cdf, target, right=True).clamp(max=scores.size(-1) - 1)
    one_hot = torch.full_like(scores, float("-inf")).scatter(-1, token, 0.0)
    return torch.where((draws >= 0).unsqueeze(-1), one_hot, scores)


def install(manager) -> None:
    """Add :class:`LogitBias` (first) and :class:`SeededSampling` (last) to a manager that has not started yet."""
    processors = manager.logit_processor
    bias = LogitBias(manager.continuous_batching_config.max_requests_per_batch, manager.model.device)
    seeded = SeededSampling()
    processors.logits_processor.insert(0, bias)
    processors.logits_processor.append(seeded)
    processors.tensors_required += 2
    processors.supported_keys.update(bias.supported_kwargs | seeded.supported_kwargs)
    processors.do_processing = True


def seed_rng(seed: int, index: int) -> random.Random:
    """The generator of choice ``index`` of a request seeded with ``seed`` (the same on every run and process)."""
    return random.Random(f"llmq:{seed}:{index}")

"""Per-request sampling for transformers' ContinuousBatchingManager, as logits processors of the engine's own kind.

The manager's own per-request processors (temperature, top-k, top-p) sort the whole vocabulary twice per step and then
sample with ``torch.multinomial``: on a CPU and a 49k-token vocabulary that cost more than the model's step. So the
engine runs the manager greedy (argmax, no processors of its own) and :func:`install` adds four processors that pick
each row's token themselves and leave only it possible, so the argmax takes it:

- :class:`LogitBias`: adds a request's biases to its row's logits.
- :class:`GrammarMask`: leaves only the tokens a constrained row's grammar allows (structured outputs).
- :class:`Temperature`: divides a sampled row's logits by its temperature.
- :class:`TopP`: the nucleus of a row with ``top_p`` < 1 (on a CPU it sorts only in steps that hold such a row).
- :class:`Draw` (last of the four): a greedy row takes its most likely token; a sampled row draws by inverse CDF on its final
  distribution with a uniform number from its own ``random.Random`` when seeded (else from a shared one). The k-th
  token of a seeded request uses its k-th draw whatever else runs: a request run alone reproduces exactly; in a mixed
  batch its logits may differ in the last bits (other batch shapes), so there it is best effort.

The logprob processors of :mod:`~llmq_worker.engines.cb_logprobs` come before and after them.

They read only their tensor argument and tensors they own (no Python branching on tensor data; TopP's shortcut is taken
only on a CPU), so they also work when the manager captures its steps in CUDA graphs or runs two steps in flight.
"""

from __future__ import annotations

import random

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

from llmq_core.constants import MAX_LOGIT_BIAS_TOKENS
from llmq_worker.engines import cb_logprobs
from llmq_worker.grammars import SequenceGrammar

GREEDY = -1.0  # the draw of a greedy row: its most likely token
_UNSEEDED = random.Random()  # draws of sampled rows without a seed


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


class GrammarMask(ContinuousBatchingLogitsProcessor):
    """Per-request ``grammar`` (a ``llmq_worker.grammars.SequenceGrammar``): each step the row's matcher consumes the
    tokens its sequence generated since, and writes its allowed-token bitmask into a line of a table of
    ``2 * rows + 1`` lines (the last one allows every token), as LogitBias does. Needs each step's tokens before the
    next step is prepared: the engine turns off the library's asynchronous batching."""

    supported_kwargs: dict[str, type] = {"grammar": SequenceGrammar}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self._rows = rows
        self._vocab = vocab_size
        self._empty = 2 * rows
        words = (vocab_size + 31) // 32
        self._host = torch.full((2 * rows + 1, words), -1, dtype=torch.int32)
        self._bits = self._host.to(device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._half = 0
        self._any = True

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(self._empty)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        base, self._half = self._half * self._rows, 1 - self._half
        lines, written = [], []
        for i, request in enumerate(requests_with_new_token):
            grammar = request.state.logit_processor_kwargs.get("grammar")
            line = base + i
            if (
                grammar is None
                or i >= self._rows
                or not grammar.fill_mask(_generated(request.state), self._host[line].numpy())
            ):
                lines.append(self._empty)
                continue
            lines.append(line)
            written.append(line)
        self._any = bool(written)
        if written and self._bits.device != self._host.device:
            index = torch.tensor(written)
            self._bits[index.to(self._bits.device)] = self._host[index].to(self._bits.device)
        return torch.tensor(lines, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self._any and scores.device.type == "cpu":
            return scores
        lines = tensor_arg[: scores.size(0)].long().clamp(0, self._empty)
        bits = self._bits[lines]  # [rows, words]
        allowed = ((bits.unsqueeze(-1) >> self._shifts) & 1).view(bits.size(0), -1)[:, : scores.size(-1)]
        return scores.masked_fill(allowed == 0, float("-inf"))


def _generated(state) -> list[int]:
    """The tokens a request generated, also after the library re-queued it (its tokens then moved into the prompt)."""
    if state._true_initial_tokens:
        return state.initial_tokens[state._true_initial_tokens :] + state.generated_tokens
    return state.generated_tokens


def _floats(values: list[float]) -> torch.Tensor:
    """One float per row, carried in the manager's int32 argument rows."""
    return torch.tensor(values, dtype=torch.float32).view(torch.int32)


def _fill_float(int32_tensor: torch.Tensor, value: float) -> None:
    int32_tensor.copy_(torch.full_like(int32_tensor, value, dtype=torch.float32).view(torch.int32))


class Temperature(ContinuousBatchingLogitsProcessor):
    """Per-request ``temperature`` (> 0; greedy rows keep 1.0)."""

    supported_kwargs: dict[str, type] = {"temperature": float}
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        _fill_float(int32_tensor, 1.0)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return _floats([r.state.logit_processor_kwargs.get("temperature", 1.0) for r in requests_with_new_token])

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        temperature = tensor_arg[: scores.size(0)].view(torch.float32)
        return scores / torch.where(temperature > 0, temperature, 1.0).unsqueeze(-1)


class TopP(ContinuousBatchingLogitsProcessor):
    """Per-request ``top_p``: the smallest set of most likely tokens whose probability reaches it (1.0: all)."""

    supported_kwargs: dict[str, type] = {"top_p": float}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._any = True  # a row of the step being prepared has top_p < 1

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        _fill_float(int32_tensor, 1.0)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        values = [r.state.logit_processor_kwargs.get("top_p", 1.0) for r in requests_with_new_token]
        self._any = any(v < 1.0 for v in values)
        return _floats(values)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self._any and scores.device.type == "cpu":  # no graph capture on a CPU: skip the sort
            return scores
        top_p = tensor_arg[: scores.size(0)].view(torch.float32).unsqueeze(-1)
        ordered, order = torch.sort(scores, descending=False, dim=-1)
        remove = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        remove[..., -1:] = False  # the most likely token always stays
        return scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


class Draw(ContinuousBatchingLogitsProcessor):
    """Per-request ``greedy`` (True) or ``seed_rng`` (a ``random.Random``): one uniform draw per sampled token."""

    supported_kwargs: dict[str, type] = {"greedy": bool, "seed_rng": random.Random}
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        _fill_float(int32_tensor, GREEDY)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return _floats([_draw(r.state.logit_processor_kwargs) for r in requests_with_new_token])

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return chosen(scores, tensor_arg[: scores.size(0)].view(torch.float32))


def _draw(kwargs: dict) -> float:
    if kwargs.get("greedy"):
        return GREEDY
    rng = kwargs.get("seed_rng")
    return (rng or _UNSEEDED).random()


def chosen(scores: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """0 at each row's token and -inf elsewhere: the most likely token of rows whose draw is negative (greedy), else
    the token whose CDF interval holds the draw ``u`` in [0, 1). ``scores``: [rows, vocab] logits; ``draws``: [rows]."""
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    target = (draws.clamp(0, 1) * cdf[:, -1]).unsqueeze(-1)
    sampled = torch.searchsorted(cdf, target, right=True).clamp(max=scores.size(-1) - 1)
    token = torch.where((draws < 0).unsqueeze(-1), scores.argmax(dim=-1, keepdim=True), sampled)
    return torch.full_like(scores, float("-inf")).scatter(-1, token, 0.0)


def install(manager, grammars: bool = True) -> None:
    """Add the engine's processors to a manager that has not started yet (and runs greedy, without processors), between
    the two of :mod:`~llmq_worker.engines.cb_logprobs` (which see the raw logits and the drawn token); ``grammars``:
    with the grammar mask (structured outputs)."""
    processors = manager.logit_processor
    rows = manager.continuous_batching_config.max_requests_per_batch
    vocab_size = manager.model.config.get_text_config().vocab_size
    raw_logprobs, record_logprobs = cb_logprobs.processors(manager)
    added = [
        raw_logprobs,
        LogitBias(rows, manager.model.device),
        *([GrammarMask(rows, vocab_size, manager.model.device)] if grammars else []),
        Temperature(),
        TopP(),
        Draw(),
        record_logprobs,
    ]
    processors.logits_processor.extend(added)
    processors.tensors_required += len(added)
    for processor in added:
        processors.supported_keys.update(processor.supported_kwargs)
    processors.do_processing = True


def seed_rng(seed: int, index: int) -> random.Random:
    """The generator of choice ``index`` of a request seeded with ``seed`` (the same on every run and process)."""
    return random.Random(f"llmq:{seed}:{index}")

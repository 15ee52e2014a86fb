"""The models llmq serves out of the box and what the API needs to know about each."""

from __future__ import annotations

import msgspec


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A served model: ``context_window`` in tokens (prompt + completion), ``max_batch_size`` in requests."""

    name: str
    engine: str
    context_window: int
    max_batch_size: int
    owned_by: str = "llmq"


LLMQ_TINY = ModelSpec(name="llmq-tiny", engine="transformers", context_window=8192, max_batch_size=32)
LLMQ_SIM = ModelSpec(name="llmq-sim", engine="simulated", context_window=8192, max_batch_size=64)
BUILTIN_MODELS: dict[str, ModelSpec] = {m.name: m for m in (LLMQ_TINY, LLMQ_SIM)}

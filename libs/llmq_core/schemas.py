"""JSON Schemas of the messages Kafka-direct producers exchange with llmq, generated from the msgspec wire types.

``docs/schemas/*.schema.json`` are this module's output (a test keeps them equal); regenerate them after changing
:mod:`llmq_core.wire` with ``python -m llmq_core.schemas docs/schemas``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from llmq_core import wire

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMAS: dict[str, type] = {
    "generation_request.schema.json": wire.GenerationRequest,  # produce to llmq.requests.<class>
    "final_result.schema.json": wire.FinalResult,  # consumed from a KafkaReply topic
}


def render() -> dict[str, str]:
    """File name -> schema text (JSON, sorted keys, 2-space indent, trailing newline)."""
    return {
        name: json.dumps({"$schema": DRAFT, **msgspec.json.schema(kind)}, indent=2, sort_keys=True) + "\n"
        for name, kind in SCHEMAS.items()
    }


def main(argv: list[str] | None = None) -> None:
    """Write every schema into the folder given as the only argument (default ``docs/schemas``)."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else "docs/schemas")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (folder / name).write_text(text)
        print(folder / name)


if __name__ == "__main__":
    main()

"""docs/configuration.md, generated from the settings' fields: ``python -m llmq_core.settings_doc [PATH]`` writes it
(default: docs/configuration.md under the current directory); tests/unit/core/test_settings_doc.py checks it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from llmq_core.settings import Settings, env_name, old_names

DEFAULT_PATH = Path("docs/configuration.md")
COMMAND = "python -m llmq_core.settings_doc"

INTRO = f"""# Configuration

<!-- Generated from libs/llmq_core/settings.py by `{COMMAND}`: edit the fields' descriptions there. -->

Every service reads its settings from environment variables, grouped by owner (`settings.api.max_body_bytes` is
`LLMQ_API_MAX_BODY_BYTES`). A service validates the groups it reads when it starts, and refuses a bad value naming its
variable; a bad value in a group it does not read is no concern of it (a worker starts with a broken
`LLMQ_API_MAX_BODY_BYTES`, an API pod does not). A variable under its old name (last column) is still read, with one
warning per process; the new name wins where both are set. Per-process flags (`--instance-id`, `--port`,
`--metrics-port`, ...) are listed by each module's `--help`; every worker flag is also a setting of the worker group.
"""


# Variables only the `llmq` command reads (not a service's settings): name -> (default, what it does).
CLI_VARIABLES = {
    "LLMQ_API_URL": ("http://127.0.0.1:8000/v1", "`llmq batch`: the API pod's base URL (`--base-url`)."),
    "LLMQ_API_KEY": ("llmq-dev-key", "`llmq batch`: the API key it sends as `Bearer` (`--api-key`)."),
    "LLMQ_CACHE_DIR": (
        "~/.cache/llmq",
        "`llmq dev install`: where the Kafka and MirrorMaker 2 jars (and the broker's class archive) are cached.",
    ),
    "LLMQ_KAFKA_VERSION": ("4.1.2", "`llmq dev install`: the Kafka release assembled from Maven Central."),
}


def _default(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "(none)"
    if value == "":
        return '""'
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value)
    return str(value)


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    text = getattr(annotation, "__name__", None) if getattr(annotation, "__args__", None) is None else None
    return text or str(annotation).replace("typing.", "").replace("llmq_core.settings.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole Markdown page: per group, its docstring and a table of its variables."""
    parts = [INTRO]
    for name in Settings.GROUPS:
        group = Settings.group_class(name)
        parts.append(f"\n## `{name}`\n\n{' '.join((group.__doc__ or '').split())}\n")
        parts.append("| variable | type | default | description | old names |\n|---|---|---|---|---|")
        for field_name, field in group.model_fields.items():
            old = ", ".join(f"`{o}`" for o in old_names(field))
            parts.append(
                f"| `{env_name(group, field_name)}` | `{_cell(_type(field))}` | `{_cell(_default(field))}`"
                f" | {_cell(field.description or '')} | {old} |"
            )
    parts.append("\n## The `llmq` command\n\nRead by the command line only, beside the settings above.\n")
    parts.append("| variable | default | description |\n|---|---|---|")
    parts += [f"| `{name}` | `{default}` | {text} |" for name, (default, text) in CLI_VARIABLES.items()]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

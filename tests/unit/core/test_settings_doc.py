"""docs/configuration.md is generated from the settings' fields and kept current."""

import re
from pathlib import Path

from llmq_core import settings_doc
from llmq_core.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "configuration.md"


def test_the_committed_configuration_page_is_the_generated_one():
    assert DOC.read_text() == settings_doc.render(), (
        f"docs/configuration.md is out of date: run `.venv/bin/{settings_doc.COMMAND}`"
    )


def test_the_page_names_every_variable_with_its_default_and_its_old_names():
    page = settings_doc.render()
    for name in Settings.variables():
        assert f"| `{name}` |" in page, name
    assert "| `LLMQ_API_INTERACTIVE_DEFAULT_TIMEOUT_MS` | `int` | `30000` |" in page
    assert "`LLMQ_DEFAULT_TIMEOUT_MS` |" in page


def test_every_variable_the_command_line_reads_is_on_the_page():
    read = re.compile(r'(?:environ\.get\(|getenv\(|envvar=)"(LLMQ_[A-Z0-9_]+)"')
    found = {name for path in (ROOT / "cli").rglob("*.py") for name in read.findall(path.read_text())}
    assert found, "the scan finds the command line's variables"
    assert found <= set(Settings.variables()) | set(settings_doc.CLI_VARIABLES), found

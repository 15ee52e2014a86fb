"""docs/configuration.md stays true: its table names every setting with its default."""

import json
import re

from llmq_core.settings import Settings
from tests.doc_examples import ROOT

CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def _table_rows() -> dict[str, str]:
    rows = re.findall(r"^\| `(LLMQ_[A-Z0-9_]+)` \| `([^`]*)` \|", CONFIGURATION, flags=re.M)
    return dict(rows)


def test_every_setting_is_in_the_configuration_table_with_its_default():
    rows = _table_rows()
    for name, field in Settings.model_fields.items():
        env = f"LLMQ_{name.upper()}"
        assert env in rows, f"{env} is missing from docs/configuration.md"
        default = field.default
        shown = rows[env]
        expected = json.dumps(default) if isinstance(default, (dict, bool)) else str(default)
        assert shown == expected, f"{env}: docs/configuration.md says {shown!r}, the code says {expected!r}"


def test_the_table_names_no_setting_that_does_not_exist():
    names = {f"LLMQ_{n.upper()}" for n in Settings.model_fields}
    assert set(_table_rows()) <= names

"""README.md stays true (its configuration table moved to docs/configuration.md: tests/unit/core/test_settings_doc.py)."""

from pathlib import Path

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def test_readme_shows_the_two_commands():
    assert "make demo" in README and "make test" in README

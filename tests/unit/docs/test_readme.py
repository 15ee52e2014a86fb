"""README.md is a front door: short, with the commands a newcomer runs first; the manual lives in docs/."""

from tests.doc_examples import ROOT

README = (ROOT / "README.md").read_text()
MAX_LINES = 250  # later sections go into docs/ pages; the README gets at most a line and a link


def test_readme_shows_the_two_commands_and_the_fast_lane():
    assert "make demo" in README and "make test" in README and "make check" in README


def test_readme_is_at_most_250_lines():
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move sections into docs/"

"""Every relative link of README.md and docs/**/*.md points at a file that exists, and at a heading it has."""

import re
from pathlib import Path

import pytest

from tests.doc_examples import DOCUMENTS, FENCE, ROOT

LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def prose(path: Path) -> str:
    """The text of a page without its fenced blocks and inline code, where a link is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", path.read_text()))


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", INLINE_CODE.sub(lambda m: m[0].strip("`"), title).lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in HEADING.finditer(prose(path)):
        base = slug(heading["title"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [m["target"] for m in LINK.finditer(prose(path)) if not m["target"].startswith(EXTERNAL)]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file_and_heading(path):
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.relative_to(ROOT)}: {target} is no file"
        assert ROOT in linked.parents or linked == ROOT, f"{path.relative_to(ROOT)}: {target} leaves the repository"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{path.relative_to(ROOT)}: {target}: no such heading"


def test_the_link_check_sees_links_and_headings():
    readme = ROOT / "README.md"
    assert "docs/README.md" in relative_links(readme)
    assert slug("Jobs larger than one batch: `llmq batch run`") == "jobs-larger-than-one-batch-llmq-batch-run"
    assert slug("Quotas (what a tenant's batches may spend)") == "quotas-what-a-tenants-batches-may-spend"


def test_every_docs_page_is_reachable_from_the_docs_index():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in relative_links(index)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md")} - {index.resolve()}
    assert pages <= linked, sorted(str(p.relative_to(ROOT)) for p in pages - linked)

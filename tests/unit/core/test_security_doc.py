"""docs/security.md's role table is generated from the ACL table the code applies (issue 34: the page said `api`
writes `llmq.requests.*` only while the ACLs let it write every `llmq.jobs.*` topic)."""

from pathlib import Path

import pytest

from llmq_core import security_doc

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"


def test_the_committed_role_table_is_the_generated_one():
    page = DOC.read_text()
    assert page == security_doc.rewrite(page), (
        f"docs/security.md's role table is out of date: run `.venv/bin/{security_doc.COMMAND}`"
    )


def test_the_table_shows_what_the_acls_grant():
    table = security_doc.render()
    api = next(row for row in table.splitlines() if row.startswith("| `api` |"))
    assert "`llmq.jobs.specs`, `llmq.jobs.lines`" in api and "llmq.jobs.*" not in api and "owners" not in api
    producer = next(row for row in table.splitlines() if row.startswith(f"| `{security_doc.PRODUCER}` |"))
    assert f"`{security_doc.REPLY}*`" in producer  # reads its reply topics


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="no role table"):
        security_doc.rewrite("# Security\n")

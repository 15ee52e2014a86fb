"""The docs' examples are all seen by the docs test: runnable ones parse, the rest say why they do not run.

tests/system/test_docs_examples.py runs every runnable block against a stack; these checks need none.
"""

import json
import subprocess

import pytest

from llmq_api.batch_jobs.inputs import Limits, check_input
from llmq_core.models import BUILTIN_MODELS
from tests.doc_examples import DOCUMENTS, ROOT, RUNNABLE, SKIP, all_examples, examples

EXAMPLES = all_examples()
RUNS = [e for e in EXAMPLES if e.runs]
MODELS = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
COMMAND_STARTS = (".venv/", "llmq ", "python", "curl ", "kcat ", "make ", "docker ", "export ", "echo ")


def test_the_readme_and_the_docs_have_runnable_examples():
    docs = {e.doc for e in RUNS}
    assert {"README.md", "docs/batch-jobs.md", "docs/kafka-producers.md"} <= docs


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_skip_mark_stands_before_a_runnable_block_and_says_why(path):
    marks = SKIP.findall(path.read_text())
    skipped = [e for e in examples(path) if e.skip is not None]
    assert len(marks) == len(skipped), f"{path.name}: a skip mark that is not right before a fence"
    for example in skipped:
        assert example.lang in RUNNABLE, f"{example}: a skip mark before a block that never runs"
        assert len(example.skip.strip()) >= 10, f"{example}: say why it does not run"


def test_no_command_hides_in_a_block_the_docs_test_does_not_run():
    for example in EXAMPLES:
        assert example.lang not in ("sh", "shell", "console", "zsh"), f"{example}: use ```bash so that it runs"
        first = next((line.strip() for line in example.code.splitlines() if line.strip()), "")
        if not example.lang:
            assert not first.startswith(COMMAND_STARTS), f"{example}: a command in a plain fence; use ```bash"


@pytest.mark.parametrize("example", RUNS, ids=str)
def test_each_runnable_example_parses(example):
    if example.lang == "python":
        compile(example.code, str(example), "exec")
    else:
        checked = subprocess.run(["bash", "-n"], input=example.code, text=True, capture_output=True)
        assert checked.returncode == 0, f"{example}: {checked.stderr}"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.lang == "jsonl"], ids=str)
def test_each_shown_batch_input_line_is_one_the_api_runs(example):
    data = example.code.encode()
    checked = check_input(data, json.loads(data.splitlines()[0])["url"], MODELS, Limits(100, 1 << 20))
    assert checked.errors == [] and checked.lines
    assert all(line.valid is not None for line in checked.lines), [line.error for line in checked.lines]

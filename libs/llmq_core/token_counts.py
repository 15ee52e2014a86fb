"""Prompt tokens counted with each model's own tokenizer, where requests are checked (API pods, the batcher's check of
Kafka-direct requests): context-window checks, usage and the cost charged to tenants.

The built-in byte-level models count UTF-8 bytes. A model with a checkpoint is counted with the ``tokenizers``
package on its ``tokenizer.json`` and its chat template rendered as transformers renders it (a sandboxed Jinja
environment), so the count equals the worker's. A model whose tokenizer cannot be loaded is counted in bytes, an upper
bound for byte-pair tokenizers: a prompt that fits is never refused for its count.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings
from llmq_core.tokenizer import count_tokens, render_chat

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenCounter(Protocol):
    def prompt(self, text: str) -> int:
        """Tokens of a completion prompt, with the special tokens the tokenizer adds itself."""
        ...

    def chat(self, messages: list) -> int:
        """Tokens of a chat's prompt (objects with ``role`` and ``content``), rendered for generation."""
        ...


class ByteCounter:
    """The built-in models' tokenizer: one token per UTF-8 byte of the text (chat: of its ``render_chat`` text)."""

    def prompt(self, text: str) -> int:
        return count_tokens(text)

    def chat(self, messages: list) -> int:
        return count_tokens(render_chat(messages))


BYTES = ByteCounter()


class TokenizerCounter:
    """A checkpoint's tokenizer (``tokenizers.Tokenizer``) and chat template (None: ``render_chat``, as the worker)."""

    def __init__(self, tokenizer, chat_template: str | None = None, special_tokens: Mapping[str, str] = {}) -> None:
        self._tokenizer = tokenizer
        self._template = _compile(chat_template) if chat_template else None
        self._special_tokens = dict(special_tokens)

    @classmethod
    def from_path(cls, path: str | Path) -> TokenizerCounter:
        """From a checkpoint directory (its tokenizer.json, chat_template.jinja or tokenizer_config.json's template)
        or a tokenizer.json file. Raises OSError or ValueError when they cannot be read."""
        from tokenizers import Tokenizer

        path = Path(path).expanduser()
        directory, file = (path, path / TOKENIZER_FILE) if path.is_dir() else (path.parent, path)
        config = _json(directory / "tokenizer_config.json")
        template_file = directory / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        special = {k: v for k in _SPECIAL_TOKENS if isinstance(v := config.get(k), str)}
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises its own Exception for a missing or malformed file
            raise OSError(f"cannot read tokenizer {file}: {exc}") from exc
        return cls(tokenizer, template if isinstance(template, str) else None, special)

    def prompt(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def chat(self, messages: list) -> int:
        """Raises ValueError when the model's chat template refuses the messages (its ``raise_exception``)."""
        import jinja2

        if self._template is None:
            return self.prompt(render_chat(messages))
        turns = [{"role": m.role, "content": m.content} for m in messages]
        try:
            text = self._template.render(messages=turns, add_generation_prompt=True, **self._special_tokens)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the model's chat template refused these messages: {exc}") from None
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def load_counters(settings: Settings) -> dict[str, TokenCounter]:
    """Model -> its counter: the catalogue's checkpoint models (from ``settings.models_dir``) and the models of
    ``settings.model_tokenizers``; any other model (and one whose tokenizer is unreadable, logged) counts bytes."""
    root = Path(settings.models.dir).expanduser()
    paths = {name: root / name for name, spec in BUILTIN_MODELS.items() if spec.source is not None}
    paths.update({name: Path(path) for name, path in settings.models.tokenizers.items()})
    counters: dict[str, TokenCounter] = {}
    for name, path in paths.items():
        try:
            counters[name] = _cached(str(path.expanduser().resolve()), _mtime_ns(path))
        except (OSError, ValueError) as exc:
            log.warning("model %s: counting tokens as UTF-8 bytes (an upper bound): %s", name, exc)
    return counters


@functools.lru_cache(maxsize=16)
def _cached(path: str, mtime_ns: int) -> TokenizerCounter:
    """One counter per tokenizer file version in a process (tokenizers count from many threads safely)."""
    return TokenizerCounter.from_path(path)


def _mtime_ns(path: Path) -> int:
    path = path.expanduser()
    return (path / TOKENIZER_FILE if path.is_dir() else path).stat().st_mtime_ns


def counter_of(counters: Mapping[str, TokenCounter], model: str) -> TokenCounter:
    return counters.get(model, BYTES)


def _json(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _compile(template: str):
    """The template in transformers' environment: sandboxed, trimmed blocks, loop controls, its globals."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment.from_string(template)

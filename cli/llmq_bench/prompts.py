"""Code-completion prompts cut from the Python standard library's own source files on this machine.

Each prompt is the code before a cursor placed at random in a stdlib module (sometimes mid-line), as an IDE plugin would
send it. Deterministic for a given seed and Python installation; needs nothing outside the machine.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import msgspec


class CodePrompt(msgspec.Struct, frozen=True, kw_only=True):
    """One JSONL line: ``id`` (module-offset), ``prompt`` (code before the cursor) and ``max_tokens``."""

    id: str
    prompt: str
    max_tokens: int


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)


# Short questions with a known answer, for a real chat model: a person reading the demo can check them.
# A claims-classification schema like seed 000's nightly job (structured outputs: bench/bench_structured.py, tests)
CLAIM_SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"enum": ["auto", "property", "health", "liability"]},
        "urgent": {"type": "boolean"},
        "amount_eur": {"type": "integer", "minimum": 0, "maximum": 1000000},
        "parties": {"type": "array", "items": {"enum": ["driver", "owner", "witness"]}, "maxItems": 3},
    },
    "required": ["category", "urgent", "amount_eur", "parties"],
    "additionalProperties": False,
}
CLAIM_TEXT = "Classify this claim as JSON: a car hit a fence on Monday, damage about 2,400 euros, nobody hurt."

CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "What is 7 times 8?",
    "Name the three primary colors.",
    "What does HTTP stand for?",
    "Which planet is closest to the Sun?",
    "Write a Python one-liner that sums the numbers from 1 to 100.",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "What is the largest ocean on Earth?",
    "Explain in one sentence what a hash table is.",
    "How many days are there in a leap year?",
]


def cut_prompts(
    count: int,
    *,
    seed: int = 0,
    min_chars: int = 200,
    max_chars: int = 3000,
    max_tokens: tuple[int, ...] = (16, 32, 48, 64),
) -> list[CodePrompt]:
    """``count`` prompts of ``min_chars``..``max_chars`` characters; a third end mid-line, the rest at a line end."""
    rng = random.Random(seed)
    sources = stdlib_sources()
    prompts = []
    while len(prompts) < count:
        path = rng.choice(sources)
        text = path.read_text(encoding="utf-8", errors="ignore")
        cursor = rng.randrange(min_chars, len(text))
        if rng.random() >= 1 / 3:  # snap the cursor to the end of its line
            end = text.find("\n", cursor)
            cursor = end + 1 if end != -1 else len(text)
        start = max(0, cursor - rng.randrange(min_chars, max_chars))
        prompt = text[start:cursor]
        if prompt.strip():
            prompts.append(CodePrompt(id=f"{path.stem}-{cursor}", prompt=prompt, max_tokens=rng.choice(max_tokens)))
    return prompts


def write_jsonl(prompts: list[CodePrompt], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    path.write_bytes(b"".join(encoder.encode(p) + b"\n" for p in prompts))
    return path


def read_jsonl(path: Path) -> list[CodePrompt]:
    decoder = msgspec.json.Decoder(CodePrompt)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


SESSION_GAP = "\n# ...\n"  # between a session's file header and the code at its cursor


def session_prompts(
    headers: int = 30,
    cursors: int = 10,
    *,
    seed: int = 0,
    header_bytes: int = 1200,
    tail_bytes: int = 430,
    max_tokens: int = 24,
) -> list[CodePrompt]:
    """Editing sessions, interleaved: ``headers`` stdlib files, ``cursors`` prompts each, shuffled together. A prompt is
    its file's header (its first lines, at most ``header_bytes``) then the ``tail_bytes`` of code before a cursor
    placed at random after the header (from a line start). So ``cursors - 1`` of every session's prompts repeat a
    prefix seen before: a repeat share of ``1 - 1 / cursors``. Shaped like the editing-session prompts these benchmarks
    were designed on (30 headers of 1,132-1,199 bytes, 10 cursors each, prompts of 1,542-1,673 bytes, 24 tokens out);
    deterministic for a seed and Python installation. Raises ValueError when the stdlib has too few large files."""
    rng = random.Random(seed)
    sources = [p for p in stdlib_sources() if p.stat().st_size > 4 * (header_bytes + tail_bytes)]
    if len(sources) < headers:
        raise ValueError(f"{headers} sessions asked, {len(sources)} stdlib files are large enough")
    prompts = []
    for path in rng.sample(sources, headers):
        text = path.read_text(encoding="utf-8", errors="ignore")
        header = text[: text.rfind("\n", 0, header_bytes) + 1]
        for i in range(cursors):
            cursor = rng.randrange(len(header) + tail_bytes, len(text))
            start = text.find("\n", cursor - tail_bytes, cursor) + 1 or cursor - tail_bytes
            prompt = header + SESSION_GAP + text[start:cursor]
            prompts.append(CodePrompt(id=f"{path.stem}-{i}", prompt=prompt, max_tokens=max_tokens))
    rng.shuffle(prompts)
    return prompts

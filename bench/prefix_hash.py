"""What the batcher's prefix hashing costs per request on prompts of 1, 2 and 4 KiB (code cut from the stdlib, as
``llmq bench scale`` sends), against the batcher's CPU per request in bench/results/scale-profile.json (below
saturation: 1.41 ms fed through the API pods, 1.93 ms fed straight to Kafka; the smaller is used). Writes bench/results/prefix-hash.json.

    .venv/bin/python bench/prefix_hash.py
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from llmq_bench.prefix_cost import hash_cost, share_of
from llmq_bench.prompts import cut_prompts

RESULTS = Path(__file__).parent / "results"
SIZES_BYTES = (1024, 2048, 4096)
PROMPTS = 2000


def batcher_ms_per_request() -> float:
    """The batcher's CPU ms per request in the profile, the least of its runs (the largest share for the hashing)."""
    profile = json.loads((RESULTS / "scale-profile.json").read_text())
    return min(r["row"]["cpu_ms_per_request"]["batcher"] for r in profile["runs"])


def main() -> None:
    batcher_ms = batcher_ms_per_request()
    rows = []
    for size in SIZES_BYTES:
        cut = cut_prompts(2 * PROMPTS, seed=size, min_chars=1000, max_chars=2 * size)
        prompts = [p.prompt.encode()[:size].decode(errors="ignore") for p in cut if len(p.prompt.encode()) >= size]
        cost = hash_cost(prompts)
        rows.append({"prompt_bytes": size, **cost, "share_of_batcher_cpu": share_of(cost, batcher_ms)})
        print(
            f"{size:>5} B: {cost['blocks_mean']:>5} blocks, {cost['us_per_request']:>6} us/request,"
            f" {100 * rows[-1]['share_of_batcher_cpu']:.2f} % of the batcher's {batcher_ms} ms"
        )
    out = {"batcher_cpu_ms_per_request": batcher_ms, "python": platform.python_version(), "rows": rows}
    (RESULTS / "prefix-hash.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

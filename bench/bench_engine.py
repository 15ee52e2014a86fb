"""Tokens/s of the worker's transformers engine vs the bare ContinuousBatchingManager vs sequential ``generate``.

One run, llmq-tiny, the same greedy requests (mixed prompt and output lengths, fixed seed) for all three; the ratios come
from that run. Prints a table and a JSON line (also written to ``--out`` when given). Greedy outputs of the three are
compared token by token as a correctness check.

    .venv/bin/python bench/bench_engine.py [--requests 128] [--max-concurrent-sequences 32] [--device cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig

from llmq_core import tokenizer as byte_tokenizer
from llmq_core.wire import GenerationRequest, HttpReply, SamplingParams
from llmq_worker.engine import FinalEvent
from llmq_worker.engines.tiny_model import build_llmq_tiny
from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs

WORDS = "the quick brown fox jumps over a lazy dog 日本 😀 café naïve".split()


def workload(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` (prompt, max_tokens) pairs: prompts of 8-512 bytes, outputs of 8-192 tokens."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        prompt, size = [], rng.randint(8, 512)
        while len(" ".join(prompt).encode()) < size:
            prompt.append(rng.choice(WORDS))
        items.append((" ".join(prompt), rng.choice([8, 16, 32, 64, 128, 192])))
    return items


async def run_engine(model, tokenizer, items, max_sequences: int, max_batched_tokens: int | None) -> tuple[float, dict]:
    engine = TransformersEngine(
        model, tokenizer, max_concurrent_sequences=max_sequences, max_batched_tokens=max_batched_tokens
    )
    texts = {}
    try:
        start = time.perf_counter()
        for i, (prompt, max_tokens) in enumerate(items):
            engine.submit(
                GenerationRequest(
                    request_id=str(i),
                    model="llmq-tiny",
                    prompt=prompt,
                    created_ms=0,
                    deadline_ms=1 << 62,
                    sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                    reply_to=HttpReply(instance_id="bench"),
                )
            )
        tokens = 0
        while len(texts) < len(items):
            for event in await engine.next_events():
                if isinstance(event, FinalEvent):
                    texts[int(event.request_id)] = event.choices[0].text
                    tokens += event.usage.completion_tokens
        elapsed = time.perf_counter() - start
    finally:
        await engine.close()
    return elapsed, {"tokens": tokens, "texts": texts}


def run_manager(model, items, max_sequences: int, max_batched_tokens: int | None) -> tuple[float, dict]:
    """The bare manager, configured like the engine (same knobs) but with the library's plain greedy sampling."""
    config = ContinuousBatchingConfig(max_requests_per_batch=max_sequences, max_batch_tokens=max_batched_tokens)
    if model.device.type == "cpu":
        config.max_batch_tokens = max_batched_tokens or 1024
        config.num_blocks = -(-8192 // config.page_size) + max_sequences
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(do_sample=False, eos_token_id=byte_tokenizer.EOS_ID, pad_token_id=0),
        continuous_batching_config=config,
    )
    manager.start()
    manager.add_request([5] * 8, request_id="warmup", max_new_tokens=4)
    manager.get_result(request_id="warmup", timeout=120)
    ids = {}
    start = time.perf_counter()
    for i, (prompt, max_tokens) in enumerate(items):
        manager.add_request(byte_tokenizer.encode(prompt), request_id=str(i), max_new_tokens=max_tokens)
    while len(ids) < len(items):
        output = manager.get_result(timeout=300)
        if output is None:
            raise RuntimeError("the manager stopped answering")
        if output.is_finished():
            ids[int(output.request_id)] = output.generated_tokens
    elapsed = time.perf_counter() - start
    manager.stop(block=True)
    return elapsed, {"tokens": sum(map(len, ids.values())), "texts": {i: _decode(t) for i, t in ids.items()}}


def run_generate(model, items) -> tuple[float, dict]:
    """One ``model.generate`` call per request, in order (no batching)."""
    texts, tokens = {}, 0
    model.generate(torch.tensor([[5] * 8], device=model.device), max_new_tokens=4, do_sample=False)
    start = time.perf_counter()
    with torch.no_grad():
        for i, (prompt, max_tokens) in enumerate(items):
            ids = torch.tensor([byte_tokenizer.encode(prompt)], device=model.device)
            out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=0, do_sample=False)[
                0, ids.shape[1] :
            ].tolist()
            texts[i], tokens = _decode(out), tokens + len(out)
    return time.perf_counter() - start, {"tokens": tokens, "texts": texts}


def _decode(ids: list[int]) -> str:
    detokenizer = byte_tokenizer.IncrementalDetokenizer()
    return detokenizer.push(ids) + detokenizer.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-concurrent-sequences", type=int, default=32)
    parser.add_argument("--max-batched-tokens", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    args = parser.parse_args()
    route_library_logs("ERROR")

    items = workload(args.requests, args.seed)
    model, tokenizer = build_llmq_tiny()
    model = model.to(args.device)
    runs = {
        "worker_engine": asyncio.run(
            run_engine(model, tokenizer, items, args.max_concurrent_sequences, args.max_batched_tokens)
        ),
        "bare_manager": run_manager(model, items, args.max_concurrent_sequences, args.max_batched_tokens),
        "sequential_generate": run_generate(model, items),
    }
    base = runs["sequential_generate"][1]["tokens"] / runs["sequential_generate"][0]
    result = {
        "model": "llmq-tiny",
        "device": args.device,
        "requests": len(items),
        "max_concurrent_sequences": args.max_concurrent_sequences,
        "completion_tokens": runs["sequential_generate"][1]["tokens"],
        "runs": {},
    }
    reference = runs["sequential_generate"][1]["texts"]
    for name, (elapsed, data) in runs.items():
        rate = data["tokens"] / elapsed
        result["runs"][name] = {
            "seconds": round(elapsed, 3),
            "tokens_per_s": round(rate, 1),
            "vs_sequential_generate": round(rate / base, 2),
            "greedy_outputs_equal_generate": sum(data["texts"][i] == reference[i] for i in reference),
        }
    engine, bare = result["runs"]["worker_engine"], result["runs"]["bare_manager"]
    result["worker_engine_vs_bare_manager"] = round(engine["tokens_per_s"] / bare["tokens_per_s"], 2)

    print(f"{'run':<22}{'seconds':>10}{'tokens/s':>12}{'x generate':>12}{'== generate':>13}")
    for name, row in result["runs"].items():
        print(
            f"{name:<22}{row['seconds']:>10.2f}{row['tokens_per_s']:>12.1f}{row['vs_sequential_generate']:>12.2f}"
            f"{row['greedy_outputs_equal_generate']:>9}/{len(items)}"
        )
    print(f"worker engine / bare manager: {result['worker_engine_vs_bare_manager']:.2f}")
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()

"""Tokens/s of the worker's transformers engine vs the bare ContinuousBatchingManager vs sequential ``generate``.

One run, the same greedy requests for all three; the ratios come from that run. llmq-tiny gets mixed prompt and output
lengths (fixed seed); a real model (``--model smollm2-135m-instruct``, installed by ``make setup``) gets code prompts
cut from the standard library (200-800 characters, 16-48 tokens). Prints a table and a JSON line (also written to
``--out`` when given). Greedy outputs of the three are compared as a correctness check.

    .venv/bin/python bench/bench_engine.py [--model llmq-tiny] [--requests 128] [--max-concurrent-sequences 32]
        [--threads N] [--runs worker_engine,bare_manager,sequential_generate] [--device cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import torch
from transformers import GenerationConfig

from llmq_bench.prompts import cut_prompts
from llmq_core.models import BUILTIN_MODELS, LLMQ_TINY
from llmq_core.settings import Settings
from llmq_core.wire import GenerationRequest, HttpReply, SamplingParams
from llmq_worker import checkpoints
from llmq_worker.engine import FinalEvent
from llmq_worker.engines import transformers_engine
from llmq_worker.engines.codec import TextCodec
from llmq_worker.engines.tiny_model import build_llmq_tiny
from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs

WORDS = "the quick brown fox jumps over a lazy dog 日本 😀 café naïve".split()


def load(name: str):
    """(model, tokenizer) of llmq-tiny (built in code) or an installed catalogue checkpoint."""
    if name == LLMQ_TINY.name:
        return build_llmq_tiny()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoints.installed_path(BUILTIN_MODELS[name], checkpoints.models_root(Settings().models.dir))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def emit(result: dict, out: str | None) -> None:
    """Print ``result`` as a JSON line, and write it to ``out`` when given."""
    line = json.dumps(result)
    print(line)
    if out:
        with open(out, "w") as handle:
            handle.write(line + "\n")


def real_workload(count: int, seed: int) -> list[tuple[str, int]]:
    return [(p.prompt, p.max_tokens) for p in cut_prompts(count, seed=seed, max_chars=800, max_tokens=(16, 32, 48))]


def request(i: int | str, prompt: str, max_tokens: int, traffic_class: str = "interactive") -> GenerationRequest:
    """A greedy request ``i`` of ``max_tokens`` (ids: str(i))."""
    return GenerationRequest(
        request_id=str(i),
        traffic_class=traffic_class,
        model="bench",
        prompt=prompt,
        created_ms=0,
        deadline_ms=1 << 62,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        reply_to=HttpReply(instance_id="bench"),
    )


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
            engine.submit(request(i, prompt, max_tokens))
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


def run_manager(model, tokenizer, items, max_sequences: int, max_batched_tokens: int | None) -> tuple[float, dict]:
    """The bare manager, configured like the engine (same knobs and end tokens) but with the library's plain greedy
    sampling."""
    codec, eos = TextCodec(tokenizer), transformers_engine._generation_config(model, tokenizer).eos_token_id
    config = transformers_engine._cb_config(
        model, max_sequences, max_batched_tokens, model.config.max_position_embeddings
    )
    config.per_request_processors = False
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(do_sample=False, eos_token_id=eos, pad_token_id=0),
        continuous_batching_config=config,
    )
    manager.start()
    manager.add_request([5] * 8, request_id="warmup", max_new_tokens=4)
    manager.get_result(request_id="warmup", timeout=120)
    ids = {}
    start = time.perf_counter()
    for i, (prompt, max_tokens) in enumerate(items):
        manager.add_request(
            codec.prompt_ids(request(i, prompt, max_tokens)), request_id=str(i), max_new_tokens=max_tokens
        )
    while len(ids) < len(items):
        output = manager.get_result(timeout=300)
        if output is None:
            raise RuntimeError("the manager stopped answering")
        if output.is_finished():
            ids[int(output.request_id)] = output.generated_tokens
    elapsed = time.perf_counter() - start
    manager.stop(block=True)
    return elapsed, {"tokens": sum(map(len, ids.values())), "texts": {i: _decode(codec, t) for i, t in ids.items()}}


def run_generate(model, tokenizer, items) -> tuple[float, dict]:
    """One ``model.generate`` call per request, in order (no batching)."""
    codec, eos = TextCodec(tokenizer), transformers_engine._generation_config(model, tokenizer).eos_token_id
    texts, tokens = {}, 0
    model.generate(torch.tensor([[5] * 8], device=model.device), max_new_tokens=4, do_sample=False)
    start = time.perf_counter()
    with torch.no_grad():
        for i, (prompt, max_tokens) in enumerate(items):
            ids = torch.tensor([codec.prompt_ids(request(i, prompt, max_tokens))], device=model.device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=0,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )[0, ids.shape[1] :].tolist()
            texts[i], tokens = _decode(codec, out), tokens + len(out)
    return time.perf_counter() - start, {"tokens": tokens, "texts": texts}


def _decode(codec: TextCodec, ids: list[int]) -> str:
    text = codec.choice([], None)
    return text.push(ids) + text.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=LLMQ_TINY.name, choices=[LLMQ_TINY.name, "smollm2-135m-instruct"])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads on CPU (0: the engine's default)"
    )
    parser.add_argument("--runs", default="worker_engine,bare_manager,sequential_generate")
    parser.add_argument("--max-concurrent-sequences", type=int, default=32)
    parser.add_argument("--max-batched-tokens", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    args = parser.parse_args()
    route_library_logs("ERROR")

    if args.device == "cpu":
        torch.set_num_threads(args.threads or transformers_engine.CPU_TORCH_THREADS)
    items = (workload if args.model == LLMQ_TINY.name else real_workload)(args.requests, args.seed)
    model, tokenizer = load(args.model)
    model = model.to(args.device)
    chosen = args.runs.split(",")
    runners = {
        "worker_engine": lambda: asyncio.run(
            run_engine(model, tokenizer, items, args.max_concurrent_sequences, args.max_batched_tokens)
        ),
        "bare_manager": lambda: run_manager(
            model, tokenizer, items, args.max_concurrent_sequences, args.max_batched_tokens
        ),
        "sequential_generate": lambda: run_generate(model, tokenizer, items),
    }
    runs = {name: run() for name, run in runners.items() if name in chosen}
    first = next(iter(runs))
    baseline = "sequential_generate" if "sequential_generate" in runs else first
    base = runs[baseline][1]["tokens"] / runs[baseline][0]
    result = {
        "model": args.model,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "requests": len(items),
        "max_concurrent_sequences": args.max_concurrent_sequences,
        "completion_tokens": runs[baseline][1]["tokens"],
        "runs": {},
    }
    reference = runs[baseline][1]["texts"]
    for name, (elapsed, data) in runs.items():
        rate = data["tokens"] / elapsed
        result["runs"][name] = {
            "seconds": round(elapsed, 3),
            "tokens_per_s": round(rate, 1),
            "vs_" + baseline: round(rate / base, 2),
            "greedy_outputs_equal_" + baseline: sum(data["texts"][i] == reference[i] for i in reference),
        }
    if {"worker_engine", "bare_manager"} <= set(runs):
        engine, bare = result["runs"]["worker_engine"], result["runs"]["bare_manager"]
        result["worker_engine_vs_bare_manager"] = round(engine["tokens_per_s"] / bare["tokens_per_s"], 2)

    print(f"{args.model}, {result['threads']} torch threads, {len(items)} requests; baseline {baseline}")
    print(f"{'run':<22}{'seconds':>10}{'tokens/s':>12}{'x baseline':>12}{'== baseline':>13}")
    for name, row in result["runs"].items():
        print(
            f"{name:<22}{row['seconds']:>10.2f}{row['tokens_per_s']:>12.1f}{row['vs_' + baseline]:>12.2f}"
            f"{row['greedy_outputs_equal_' + baseline]:>9}/{len(items)}"
        )
    if "worker_engine_vs_bare_manager" in result:
        print(f"worker engine / bare manager: {result['worker_engine_vs_bare_manager']:.2f}")
    emit(result, args.out)


if __name__ == "__main__":
    main()

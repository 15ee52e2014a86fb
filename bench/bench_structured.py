"""What structured outputs cost the requests beside them: tokens/s of unconstrained requests in the worker's transformers
engine with constrained ones (a JSON schema, decoded under llguidance's mask) in the same batch, against the same batch
with unconstrained ones in their place; and what a grammar compile costs, cold and cached.

Three runs on one engine, the same unconstrained requests (greedy, ``--max-tokens`` each) in all:
  alone        the unconstrained requests only;
  beside_free  with ``--beside`` more unconstrained requests (the batch shape of the next run);
  beside_json  with ``--beside`` requests constrained to a claims-classification schema instead.
``ratio`` = tokens/s of the unconstrained requests in beside_json / in beside_free: what the grammar masks of their
neighbours cost them (1.0: nothing). Prints a JSON line (also written to ``--out`` when given).

    .venv/bin/python bench/bench_structured.py [--model smollm2-135m-instruct] [--requests 16] [--beside 16]
        [--max-tokens 32] [--max-concurrent-sequences 32] [--device cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from bench_engine import load, real_workload

from llmq_bench.prompts import CLAIM_SCHEMA as CLAIM
from llmq_bench.prompts import CLAIM_TEXT
from llmq_core import structured
from llmq_core.wire import ChatMessage, GenerationRequest, HttpReply, SamplingParams, Structured
from llmq_worker.engine import FinalEvent
from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs


def plain(i: int, prompt: str, max_tokens: int) -> GenerationRequest:
    return _request(f"u{i}", max_tokens, prompt=prompt)


def constrained(i: int, max_tokens: int, constraint: Structured | None) -> GenerationRequest:
    messages = [ChatMessage(role="user", content=f"{CLAIM_TEXT} (#{i})")]
    return _request(f"c{i}", max_tokens, messages=messages, endpoint="chat.completions", structured=constraint)


def _request(request_id: str, max_tokens: int, **fields) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        model="bench",
        created_ms=0,
        deadline_ms=1 << 62,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        reply_to=HttpReply(instance_id="bench"),
        **fields,
    )


async def run(engine: TransformersEngine, requests: list[GenerationRequest]) -> dict:
    """Submit all at once; tokens/s of the unconstrained ones (``u*``): their tokens over the time until the last of
    them ended."""
    started = time.perf_counter()
    for request in requests:
        engine.submit(request)
    finals: dict[str, FinalEvent] = {}
    unconstrained_done = 0.0
    wanted = {r.request_id for r in requests if r.request_id.startswith("u")}
    while len(finals) < len(requests):
        for event in await engine.next_events():
            if isinstance(event, FinalEvent):
                finals[event.request_id] = event
                if event.request_id in wanted and wanted <= finals.keys() and not unconstrained_done:
                    unconstrained_done = time.perf_counter() - started
    tokens = sum(finals[r].usage.completion_tokens for r in wanted)
    parsed = [_parses(finals[r.request_id]) for r in requests if r.structured is not None]
    return {
        "unconstrained_tokens": tokens,
        "unconstrained_s": round(unconstrained_done, 3),
        "unconstrained_tokens_per_s": round(tokens / unconstrained_done, 1),
        "constrained_answers_parsed": f"{sum(parsed)}/{len(parsed)}",
    }


def _parses(final: FinalEvent) -> bool:
    try:
        json.loads(final.choices[0].text)
    except ValueError:
        return False
    return True


def compile_costs(engine: TransformersEngine, schemas: list[dict]) -> dict:
    """Milliseconds of a cold compile (a fresh cache entry per schema) and of a hit (a copy of the compiled matcher)."""
    grammars = engine._grammars
    cold, hits = [], []
    for i, schema in enumerate(schemas):
        constraint = structured.json_schema_constraint(f"s{i}", schema | {"description": f"bench {time.time_ns()}"})
        started = time.perf_counter()
        grammars.compile(constraint)
        cold.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        grammars.cached(constraint)
        hits.append((time.perf_counter() - started) * 1000)
    return {
        "compile_ms_median": round(statistics.median(cold), 3),
        "compile_ms_max": round(max(cold), 3),
        "hit_ms_median": round(statistics.median(hits), 4),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--beside", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-concurrent-sequences", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out")
    args = parser.parse_args()
    route_library_logs()
    model, tokenizer = load(args.model)
    engine = TransformersEngine(
        model.to(args.device), tokenizer, max_concurrent_sequences=args.max_concurrent_sequences
    )
    try:
        items = real_workload(args.requests, seed=1)
        unconstrained = [plain(i, prompt, args.max_tokens) for i, (prompt, _) in enumerate(items)]
        claim = structured.json_schema_constraint("claim", CLAIM)
        engine._grammars.compile(claim)  # compiled once: the runs measure decoding, not the (cached) compile
        runs = {
            "alone": await run(engine, unconstrained),
            "beside_free": await run(
                engine, unconstrained + [constrained(i, args.max_tokens, None) for i in range(args.beside)]
            ),
            "beside_json": await run(
                engine, unconstrained + [constrained(i, args.max_tokens, claim) for i in range(args.beside)]
            ),
        }
        free, constrained_run = runs["beside_free"], runs["beside_json"]
        report = {
            "model": args.model,
            "device": args.device,
            "requests": args.requests,
            "beside": args.beside,
            "max_tokens": args.max_tokens,
            "runs": runs,
            "ratio": round(constrained_run["unconstrained_tokens_per_s"] / free["unconstrained_tokens_per_s"], 3),
            "grammar": compile_costs(engine, [CLAIM, {"enum": ["a", "b"]}, {"type": "array", "items": CLAIM}]),
        }
    finally:
        await engine.close()
    line = json.dumps(report)
    print(line)
    if args.out:
        with open(args.out, "w") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    asyncio.run(main())

"""Interactive TTFT on a worker full of long deferred generations, with and without preemption (one run).

The worker's transformers engine (continuous batching on transformers' manager) runs a real model
(``--model smollm2-135m-instruct``, installed by ``make setup``; llmq-tiny for a quick look). Three phases, each on
a fresh engine of ``--slots`` slots:

- idle: ``--arrivals`` interactive requests arrive every ``--gap-ms`` (open loop) at the idle engine: the baseline;
- preempt: ``--slots`` deferred requests of ``--deferred-tokens`` fill every slot; once each has streamed a token,
  the same interactive requests arrive on the same schedule. The engine preempts deferred work for them
  (``max_preemptions`` as the setting's default);
- no-preempt: the same with ``max_preemptions=0``: people wait for a slot.

One engine step is the median inter-token interval of the deferred sequences while all slots run them (the
no-preempt phase, before the arrivals). The goal: interactive TTFT p99 with preemption at most the idle p99 plus one
step. Also reported: the deferred requests' completion times (from their submit) and the tokens their resumes
prefilled again. Prints a table and a JSON line (also written to ``--out``).

    .venv/bin/python bench/bench_preemption.py [--model smollm2-135m-instruct] [--slots 4] [--arrivals 8]
        [--gap-ms 1500] [--deferred-tokens 256] [--interactive-tokens 8] [--max-batched-tokens N] [--no-prefix-cache] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from bench_engine import emit, load, request  # noqa: E402  (a sibling script: run from bench/ or with it on sys.path)

from llmq_bench.prompts import cut_prompts
from llmq_core.constants import DEFERRED, INTERACTIVE
from llmq_core.settings import WorkerSettings
from llmq_core.wire import GenerationRequest
from llmq_worker.engine import ChunkEvent, FinalEvent
from llmq_worker.engines import transformers_engine
from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs
from llmq_worker.prefix_cache import PrefixLedger

DEFAULT_MAX_PREEMPTIONS = WorkerSettings.model_fields["max_preemptions"].default


class Watch:
    """Pumps one engine's events: each request's submit time, token times and end."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.submitted: dict[str, float] = {}
        self.tokens: dict[str, list[float]] = {}
        self.ended: dict[str, asyncio.Future] = {}
        self.first: dict[str, asyncio.Future] = {}
        self._task = asyncio.create_task(self._pump())

    def submit(self, r: GenerationRequest) -> None:
        loop = asyncio.get_running_loop()
        self.first[r.request_id], self.ended[r.request_id] = loop.create_future(), loop.create_future()
        self.tokens[r.request_id] = []
        self.submitted[r.request_id] = time.perf_counter()
        self.engine.submit(r)

    async def _pump(self) -> None:
        while True:
            for event in await self.engine.next_events():
                now = time.perf_counter()
                rid = event.request_id
                if isinstance(event, ChunkEvent) and event.token_ids:
                    self.tokens[rid] += [now] * len(event.token_ids)
                    if not self.first[rid].done():
                        self.first[rid].set_result(now)
                elif isinstance(event, FinalEvent):
                    if not self.first[rid].done():
                        self.first[rid].set_result(now)
                    self.ended[rid].set_result((now, event))

    async def ttft_ms(self, rid: str) -> float:
        return 1000 * (await self.first[rid] - self.submitted[rid])

    async def done_s(self, rid: str) -> float:
        end, final = await self.ended[rid]
        assert final.outcome.value == "succeeded", (rid, final.outcome, final.error)
        return end - self.submitted[rid]

    async def close(self) -> None:
        self._task.cancel()
        await self.engine.close()


def percentile(values: list[float], q: float) -> float:
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(q * len(ranked)))]


async def phase(make, max_preemptions: int, fill: list[GenerationRequest], people, gap_ms: int) -> dict:
    """``fill`` (deferred) first, each until it streams; then ``people`` every ``gap_ms``."""
    watch = Watch(make(max_preemptions))
    for r in fill:
        watch.submit(r)
    await asyncio.gather(*(watch.first[r.request_id] for r in fill))
    step_start = time.perf_counter()
    if fill:  # a window of steady decoding to time one step in (a measurement, not a wait for state)
        await asyncio.sleep(1.0)
    steps = [
        b - a
        for r in fill
        for a, b in zip(watch.tokens[r.request_id], watch.tokens[r.request_id][1:], strict=False)
        if a >= step_start and b > a
    ]
    ttfts = []
    for i, r in enumerate(people):
        if i:
            await asyncio.sleep(gap_ms / 1000)  # the open-loop arrival schedule
        watch.submit(r)
    ttfts = [await watch.ttft_ms(r.request_id) for r in people]
    deferred_s = [await watch.done_s(r.request_id) for r in fill]
    for r in people:
        await watch.done_s(r.request_id)
    stats = watch.engine.preemption_stats
    result = {
        "ttft_ms": ttfts,
        "step_ms": 1000 * statistics.median(steps) if steps else None,
        "deferred_done_s": deferred_s,
        "preemptions": sum(stats.preemptions.values()),
        "resumes": stats.resumes,
        "recomputed_tokens": stats.recomputed_tokens,
    }
    await watch.close()
    return result


def summary(phase: dict) -> dict:
    """A full phase's figures: TTFT percentiles and each arrival's, the deferred work's, the preemptions'."""
    ttfts = phase["ttft_ms"]
    rest = {k: v for k, v in phase.items() if k not in ("ttft_ms", "step_ms")}
    return {"ttft_ms": {"p50": percentile(ttfts, 0.5), "p99": percentile(ttfts, 0.99)}, "ttfts_ms": ttfts} | rest


async def main_async(args: argparse.Namespace) -> dict:
    model, tokenizer = load(args.model)

    def make(max_preemptions: int) -> TransformersEngine:
        return TransformersEngine(
            model,
            tokenizer,
            max_concurrent_sequences=args.slots,
            max_batched_tokens=args.max_batched_tokens,
            max_preemptions=max_preemptions,
            prefix_ledger=PrefixLedger.from_settings(WorkerSettings(prefix_cache=args.prefix_cache)),
        )

    prompts = cut_prompts(args.slots + args.arrivals, seed=args.seed, max_chars=600)
    fill = [request(f"d{i}", p.prompt, args.deferred_tokens, DEFERRED) for i, p in enumerate(prompts[: args.slots])]
    people = [
        request(f"i{i}", p.prompt, args.interactive_tokens, INTERACTIVE) for i, p in enumerate(prompts[args.slots :])
    ]
    idle = (await phase(make, DEFAULT_MAX_PREEMPTIONS, [], people, args.gap_ms))["ttft_ms"]
    off = await phase(make, 0, fill, people, args.gap_ms)
    on = await phase(make, DEFAULT_MAX_PREEMPTIONS, fill, people, args.gap_ms)
    step_ms = off["step_ms"]
    return {
        "bench": "preemption",
        "engine": "transformers (ContinuousBatchingManager), CPU, 1 torch thread",
        "model": args.model,
        "slots": args.slots,
        "arrivals": args.arrivals,
        "gap_ms": args.gap_ms,
        "deferred_tokens": args.deferred_tokens,
        "interactive_tokens": args.interactive_tokens,
        "max_batched_tokens": args.max_batched_tokens or transformers_engine.CPU_MAX_BATCHED_TOKENS,
        "prefix_cache": args.prefix_cache,
        "idle_ttfts_ms": idle,
        "idle_ttft_ms": {"p50": percentile(idle, 0.5), "p99": percentile(idle, 0.99)},
        "step_ms": step_ms,
        "preempt": summary(on),
        "no_preempt": summary(off),
        "goal_met": percentile(on["ttft_ms"], 0.99) <= percentile(idle, 0.99) + step_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--arrivals", type=int, default=8)
    parser.add_argument("--gap-ms", type=int, default=1500)
    parser.add_argument("--deferred-tokens", type=int, default=256)
    parser.add_argument("--interactive-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=WorkerSettings.model_fields["prefix_cache"].default,
        help="the engine's prefix cache (block sharing), as the worker's setting (default: on)",
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        help="tokens per engine step (prefill chunks + decodes; default: the engine's)",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    route_library_logs("ERROR")
    torch.set_num_threads(transformers_engine.CPU_TORCH_THREADS)
    result = asyncio.run(main_async(args))
    idle, on, off = result["idle_ttft_ms"], result["preempt"], result["no_preempt"]
    print(f"one engine step (all {args.slots} slots decoding): {result['step_ms']:.0f} ms")
    print("| phase | TTFT p50 ms | TTFT p99 ms | deferred done s (max) | preemptions | recomputed tokens |")
    print("|---|---|---|---|---|---|")
    print(f"| idle worker | {idle['p50']:.0f} | {idle['p99']:.0f} | - | - | - |")
    for name, phase in (("full, preemption", on), ("full, no preemption", off)):
        print(
            f"| {name} | {phase['ttft_ms']['p50']:.0f} | {phase['ttft_ms']['p99']:.0f} |"
            f" {max(phase['deferred_done_s']):.1f} | {phase['preemptions']} | {phase['recomputed_tokens']} |"
        )
    print(f"goal (preempt p99 <= idle p99 + one step): {'met' if result['goal_met'] else 'NOT met'}")
    emit(result, args.out)


if __name__ == "__main__":
    main()

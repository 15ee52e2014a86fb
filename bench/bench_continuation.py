"""Tokens recomputed per re-dispatch when a worker is lost mid-generation: continued from its progress frames, and run
again from the start (continuation off), in one run.

The worker's own parts, without Kafka and Redis between them: worker A (a ``WorkerCore`` on the transformers engine)
takes a batch of requests, half streamed, and writes its Progress frames as its loop does (a stream's with each chunk,
the others' every ``--progress-interval-ms``); after ``--kill-after-tokens`` tokens of its first request A is dropped
(its engine closed: no frame after that). The batcher's rule (``llmq_core.continuation.continued``) turns the frames
into each request's next attempt, which worker B runs to its end. Per re-dispatched request: tokens A generated,
tokens the continuation carried, tokens generated twice (A's not in any frame yet), prompt + carried tokens prefilled
again, and whether the final answer counts each token once (usage == max_tokens, text == an uninterrupted greedy
run's). The goal: nothing generated twice but a non-stream's last interval.

    .venv/bin/python bench/bench_continuation.py [--model smollm2-135m-instruct] [--requests 8] [--max-tokens 96]
        [--kill-after-tokens 40] [--progress-interval-ms 500] [--out bench/results/continuation.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import msgspec
import torch
from bench_engine import emit, load, request

from llmq_bench.prompts import cut_prompts
from llmq_core import continuation
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.settings import BatcherSettings, WorkerSettings
from llmq_core.wire import Batch, FinalResult
from llmq_worker.core import WorkerCore
from llmq_worker.engine import ChunkEvent
from llmq_worker.engines import transformers_engine
from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs


class Worker:
    """A WorkerCore on a fresh engine, pumped here: its Progress frames kept as Redis would, its results collected,
    and the token ids its engine generated per request."""

    def __init__(self, worker_id: str, engine: TransformersEngine, interval_ms: int) -> None:
        self.core = WorkerCore(worker_id=worker_id, partition=0, model="bench", engine=engine, clock=SYSTEM_CLOCK)
        self.engine = engine
        self.frames: dict[str, list] = {}
        self.generated: dict[str, int] = {}
        self.results: dict[str, FinalResult] = {}
        self._interval_s = interval_ms / 1000

    def take(self, batch: Batch) -> None:
        self._keep(self.core.take_batch(batch, offset=0))

    def _keep(self, out) -> None:
        for request_id, frame, _ttl in out.progress:
            self.frames.setdefault(request_id, []).append(frame)
        self.results.update((r.request_id, r) for r in out.results)

    async def run_until(self, done) -> None:
        """Pump engine events into the core (frames flushed every interval) until ``done()``."""
        next_flush = time.monotonic() + self._interval_s
        while not done():
            try:
                events = await asyncio.wait_for(self.engine.next_events(), max(next_flush - time.monotonic(), 0))
            except TimeoutError:
                events = []
            for event in events:
                if isinstance(event, ChunkEvent):
                    self.generated[event.request_id] = self.generated.get(event.request_id, 0) + len(event.token_ids)
            self._keep(self.core.on_events(events))
            if time.monotonic() >= next_flush:
                self._keep(self.core.flush_progress())
                next_flush = time.monotonic() + self._interval_s


async def redispatch(make, requests: list, args, max_hops: int) -> list[dict]:
    """Worker A runs ``requests`` until the first has generated ``--kill-after-tokens``, then is lost; worker B runs
    each request's next attempt (continued by the batcher's rule, ``max_hops`` 0: from its start). Per request: the
    figures of the module docstring."""
    a = Worker("a", make(), args.progress_interval_ms)
    a.take(Batch(batch_id="b1", worker_id="a", model="bench", requests=requests, formed_ms=0, flush_reason="size"))
    first = requests[0].request_id
    await a.run_until(lambda: a.generated.get(first, 0) >= args.kill_after_tokens or a.results)
    await a.engine.close()  # lost: nothing more of it reaches anyone
    again = [
        continuation.continued(msgspec.structs.replace(r, attempt=1), a.frames.get(r.request_id, []), max_hops)
        for r in requests
    ]
    b = Worker("b", make(), args.progress_interval_ms)
    b.take(Batch(batch_id="b2", worker_id="b", model="bench", requests=again, formed_ms=0, flush_reason="size"))
    await b.run_until(lambda: len(b.results) == len(requests))
    await b.engine.close()
    rows = []
    for r in again:
        carried = sum(len(ids) for ids in r.continuation.token_ids) if r.continuation else 0
        result = b.results[r.request_id]
        rows.append(
            {
                "stream": r.stream,
                "generated_on_a": a.generated.get(r.request_id, 0),
                "carried": carried,
                "generated_twice": a.generated.get(r.request_id, 0) - carried,
                "prefilled_again": result.usage.prompt_tokens + carried,
                "generated_on_b": b.generated.get(r.request_id, 0),
                "completion_tokens": result.usage.completion_tokens,
                "text": result.choices[0].text,
            }
        )
    return rows


def summary(rows: list[dict], reference: dict[int, str], max_tokens: int) -> dict:
    """Means per re-dispatched request, streamed and not, and whether every answer counted each token once and
    equals its uninterrupted run."""
    out = {}
    for kind, streamed in (("streamed", True), ("not_streamed", False)):
        these = [r for r in rows if r["stream"] is streamed]
        out[kind] = {
            key: statistics.mean(r[key] for r in these)
            for key in ("generated_on_a", "carried", "generated_twice", "prefilled_again", "generated_on_b")
        }
    out["each_token_once"] = all(r["completion_tokens"] == max_tokens for r in rows)
    out["text_as_uninterrupted"] = sum(r["text"] == reference[i] for i, r in enumerate(rows))
    return out


async def main_async(args: argparse.Namespace) -> dict:
    model, tokenizer = load(args.model)

    def make() -> TransformersEngine:
        return TransformersEngine(model, tokenizer, max_concurrent_sequences=args.requests)

    prompts = cut_prompts(args.requests, seed=args.seed, max_chars=600)
    requests = [
        msgspec.structs.replace(
            request(f"r{i}", p.prompt, args.max_tokens), stream=i % 2 == 1, deadline_ms=SYSTEM_CLOCK.now_ms() + 600_000
        )
        for i, p in enumerate(prompts)
    ]
    alone = Worker("ref", make(), args.progress_interval_ms)  # the uninterrupted answers, all in one batch like A's
    alone.take(
        Batch(batch_id="ref", worker_id="ref", model="bench", requests=requests, formed_ms=0, flush_reason="size")
    )
    await alone.run_until(lambda: len(alone.results) == len(requests))
    await alone.engine.close()
    reference = {i: alone.results[r.request_id].choices[0].text for i, r in enumerate(requests)}
    hops = BatcherSettings.model_fields["max_continuations"].default
    continued = await redispatch(make, requests, args, hops)
    from_start = await redispatch(make, requests, args, 0)
    return {
        "bench": "continuation",
        "engine": "transformers (ContinuousBatchingManager), CPU, 1 torch thread",
        "model": args.model,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "kill_after_tokens": args.kill_after_tokens,
        "progress_interval_ms": args.progress_interval_ms,
        "continued": summary(continued, reference, args.max_tokens),
        "from_start": summary(from_start, reference, args.max_tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--kill-after-tokens", type=int, default=40)
    parser.add_argument(
        "--progress-interval-ms", type=int, default=WorkerSettings.model_fields["progress_interval_ms"].default
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out")
    args = parser.parse_args()
    route_library_logs("ERROR")
    torch.set_num_threads(transformers_engine.CPU_TORCH_THREADS)
    result = asyncio.run(main_async(args))
    print("| re-dispatched request (mean) | generated on A | carried | generated twice | prefilled again | on B |")
    print("|---|---|---|---|---|---|")
    for mode in ("continued", "from_start"):
        for kind in ("streamed", "not_streamed"):
            row = result[mode][kind]
            print(
                f"| {mode}, {kind} | {row['generated_on_a']:.1f} | {row['carried']:.1f} |"
                f" {row['generated_twice']:.1f} | {row['prefilled_again']:.1f} | {row['generated_on_b']:.1f} |"
            )
        print(
            f"{mode}: each token counted once: {result[mode]['each_token_once']}; text as uninterrupted:"
            f" {result[mode]['text_as_uninterrupted']}/{args.requests}"
        )
    emit(result, args.out)


if __name__ == "__main__":
    main()

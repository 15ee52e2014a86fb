"""GPU check of the worker's ``vllm`` engine (needs a CUDA GPU and vllm installed; nothing is downloaded).

Saves a small random-weight Llama with llmq's byte tokenizer (ByT5 ids, head_dim 64 so vLLM's attention kernels take it)
as a checkpoint, runs :class:`~llmq_worker.engines.vllm_engine.VllmEngine` on it and checks what the worker relies on:
streamed chunks add up to the final text, usage, stop strings (never returned), n choices, seeds that reproduce, logit_bias,
cancel within a step, unknown logit_bias ids rejected; then prints tokens/s of a concurrent burst. Exit status 1 on any
failed check. Greedy text is also compared with transformers' ``generate`` on the same weights (reported, not asserted:
random weights have near ties that float rounding can flip).

    python bench/gpu_check_vllm.py [--dir /tmp/llmq-vllm-tiny] [--requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import torch
from transformers import LlamaForCausalLM

from llmq_core import tokenizer as byte_tokenizer
from llmq_core.wire import GenerationRequest, HttpReply, Outcome, SamplingParams
from llmq_worker.engine import FinalEvent, InvalidRequest
from llmq_worker.engines.tiny_model import SEED, tiny_config, tiny_tokenizer
from llmq_worker.engines.vllm_engine import VllmEngine


def save_checkpoint(path: str) -> LlamaForCausalLM:
    """A 2-layer Llama (hidden 256, 4 heads of 64) over the byte vocabulary; special ids never win greedy decoding."""
    config = tiny_config(hidden_size=256, intermediate_size=512, max_position_embeddings=2048)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[: byte_tokenizer.BYTE_OFFSET].zero_()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


def request(rid: str, prompt: str, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(
        request_id=rid,
        model="vllm-check",
        prompt=prompt,
        sampling=SamplingParams(**sampling),
        created_ms=int(time.time() * 1000),
        deadline_ms=1 << 60,
        reply_to=HttpReply(instance_id="x"),
    )


async def run(engine, *requests, cancel_after_chunk: str | None = None):
    """Submit, collect finals and streamed text per (request, choice); cancel ``cancel_after_chunk`` at its first chunk."""
    for r in requests:
        engine.submit(r)
    finals, streamed = {}, {}
    async with asyncio.timeout(300):
        while len(finals) < len(requests):
            for event in await engine.next_events():
                if isinstance(event, FinalEvent):
                    finals[event.request_id] = event
                    continue
                key = (event.request_id, event.index)
                streamed[key] = streamed.get(key, "") + event.text
                if event.request_id == cancel_after_chunk:
                    engine.cancel(cancel_after_chunk)
    return finals, streamed


async def checks(engine, model, burst: int) -> dict:
    results: dict[str, object] = {}

    def check(name: str, ok: bool) -> None:
        results[name] = bool(ok)

    prompt = "The quick brown fox 🦊"
    finals, streamed = await run(engine, request("g1", prompt, max_tokens=32), request("g2", prompt, max_tokens=32))
    text = finals["g1"].choices[0].text
    check(
        "greedy_well_formed",
        finals["g1"].outcome is Outcome.SUCCEEDED
        and streamed.get(("g1", 0), "") == text
        and "\ufffd" not in text
        and finals["g1"].choices[0].finish_reason == "length",
    )
    check(
        "greedy_usage",
        (finals["g1"].usage.prompt_tokens, finals["g1"].usage.completion_tokens) == (len(prompt.encode()), 32),
    )
    check("greedy_deterministic", finals["g2"].choices[0].text == text)
    ids = byte_tokenizer.encode(prompt)
    with torch.no_grad():
        reference = model.to("cuda").generate(torch.tensor([ids], device="cuda"), max_new_tokens=32, do_sample=False)
    expected = byte_tokenizer.IncrementalDetokenizer()
    expected_text = expected.push(reference[0, len(ids) :].tolist()) + expected.finish()
    results["greedy_equals_transformers_generate"] = text == expected_text  # reported only

    stop = text[len(text) // 2 : len(text) // 2 + 2]
    finals, streamed = await run(engine, request("st", prompt, max_tokens=32, stop=[stop]))
    cut = text[: text.index(stop)]
    check(
        "stop_string_cut",
        (finals["st"].choices[0].text, finals["st"].choices[0].finish_reason) == (cut, "stop")
        and streamed.get(("st", 0), "") == cut,
    )

    seeded = [request(f"s{i}", "seed me", max_tokens=40, temperature=1.0, seed=7, n=3) for i in range(2)]
    finals, _ = await run(engine, seeded[0])
    again, _ = await run(engine, seeded[1])
    texts = [c.text for c in finals["s0"].choices]
    check("seed_reproduces_alone", texts == [c.text for c in again["s1"].choices])
    check("n_choices_differ", len(texts) == 3 and len(set(texts)) > 1 and finals["s0"].usage.completion_tokens <= 120)

    z = byte_tokenizer.encode("z")[0]
    finals, _ = await run(engine, request("b", "bias", max_tokens=12, temperature=1.0, logit_bias={z: 100.0}))
    check("logit_bias_applied", finals["b"].choices[0].text == "z" * 12)
    try:
        engine.submit(request("bad", "x", logit_bias={100_000: 1.0}))
        check("unknown_logit_bias_rejected", False)
    except InvalidRequest:
        check("unknown_logit_bias_rejected", True)

    finals, _ = await run(engine, request("long", "go", max_tokens=1500), cancel_after_chunk="long")
    check(
        "cancel_within_a_step",
        finals["long"].outcome is Outcome.CANCELED
        and finals["long"].usage.completion_tokens < 1500
        and engine.capacity().running == 0,
    )

    start = time.perf_counter()
    finals, _ = await run(engine, *(request(f"t{i}", f"burst {i}", max_tokens=128) for i in range(burst)))
    elapsed = time.perf_counter() - start
    tokens = sum(f.usage.completion_tokens for f in finals.values())
    check("burst_all_succeeded", all(f.outcome is Outcome.SUCCEEDED for f in finals.values()))
    results["burst_tokens_per_s"] = round(tokens / elapsed, 1)
    return results


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/llmq-vllm-tiny")
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    model = save_checkpoint(args.dir)
    engine = VllmEngine.from_args(
        model_path=args.dir,
        max_concurrent_sequences=64,
        max_batched_tokens=None,
        gpu_memory_utilization=0.3,
        engine_args={"dtype": "float32", "max_model_len": 2048},
    )
    try:
        results = await checks(engine, model, args.requests)
    finally:
        await engine.close()
    print(json.dumps(results))
    failed = [name for name, ok in results.items() if ok is False and name != "greedy_equals_transformers_generate"]
    print("failed checks:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""The peer llmq is measured against: Ray Serve with ``@serve.batch`` in front of the same simulated fixed-time model.

An OpenAI-compatible ``/v1/completions`` (plain and ``stream: true``) whose replicas each run one batch at a time: up to
``max_batch_size`` requests gathered for at most ``batch_wait_timeout_s``, then ``batch_time_ms`` of sleep, the text
replaying the prompt like llmq-sim (same byte tokenizer, same 32 emission ticks per batch so streams stream alike).
Batches are counted in a named actor (:class:`BatchCounter`) so a bench reads batch fill the way it reads llmq's.

Needs ``ray[serve]`` (the ``bench`` extra), not a runtime dependency of llmq.
Run alone: ``python -m llmq_bench.ray_peer --port 8500`` (Ctrl-C stops it).
"""

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmq_core.tokenizer import IncrementalDetokenizer, count_tokens, encode

NAMESPACE = "llmq-bench"
COUNTER_NAME = "llmq-bench-batches"
APP_NAME = "llmq-sim-peer"
MAX_TICKS = 32  # as llmq-sim: emission steps per batch


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """Shape of the peer: replicas (one per simulated accelerator), batch size, batch time and wait window."""

    replicas: int = 2
    max_batch_size: int = 64
    batch_time_ms: int = 500
    batch_wait_timeout_s: float = 0.02  # llmq's fixed_engine_max_wait_ms
    port: int = 8500


def replay_ids(prompt: str, max_tokens: int) -> list[int]:
    """llmq-sim's completion: the prompt's own token ids from its start, cycled to ``max_tokens``."""
    ids = encode(prompt)
    return [ids[i % len(ids)] for i in range(max_tokens)] if ids else []


def tick_targets(lengths: list[int], ticks: int, tick: int) -> list[int]:
    """Tokens each request has emitted after ``tick`` of ``ticks`` evenly spaced steps (llmq-sim's schedule)."""
    return [length * tick // ticks for length in lengths]


def completion_body(request_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """An OpenAI ``text_completion`` object with one choice (finish_reason ``length``, as llmq-sim without stops)."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chunk_event(request_id: str, model: str, text: str, finish_reason: str | None) -> bytes:
    """One SSE event of a streamed completion."""
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def build_app(cfg: PeerConfig):
    """The Ray Serve application (deployment bound to ``cfg``). Imports Ray here: the module loads without it."""
    import ray
    from ray import serve

    api = FastAPI()

    @serve.deployment(num_replicas=cfg.replicas, max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class SimCompletions:
        def __init__(self) -> None:
            self.batch_time_s = cfg.batch_time_ms / 1000
            self.counter = ray.get_actor(COUNTER_NAME, namespace=NAMESPACE)
            self.run_batch.set_max_batch_size(cfg.max_batch_size)
            self.run_batch.set_batch_wait_timeout_s(cfg.batch_wait_timeout_s)

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.02, max_concurrent_batches=1)
        async def run_batch(self, jobs: list[tuple[str, int]]):
            """One fixed-time batch: yields, per tick, each request's new text (all end together at batch time)."""
            loop = asyncio.get_running_loop()
            start_s = loop.time()
            self.counter.add.remote(len(jobs))
            ids = [replay_ids(prompt, max_tokens) for prompt, max_tokens in jobs]
            detoks = [IncrementalDetokenizer() for _ in jobs]
            emitted = [0] * len(jobs)
            ticks = max(1, min(MAX_TICKS, max(len(i) for i in ids)))
            for tick in range(1, ticks + 1):
                await asyncio.sleep(max(0.0, start_s + self.batch_time_s * tick / ticks - loop.time()))
                targets = tick_targets([len(i) for i in ids], ticks, tick)
                texts = [detoks[j].push(ids[j][emitted[j] : targets[j]]) for j in range(len(jobs))]
                emitted = targets
                if tick == ticks:
                    texts = [text + detok.finish() for text, detok in zip(texts, detoks)]
                yield texts

        @api.post("/v1/completions")
        async def completions(self, request: Request):
            body = await request.json()
            prompt, max_tokens = body["prompt"], int(body.get("max_tokens", 16))
            model, request_id = body.get("model", "llmq-sim"), f"cmpl-{uuid.uuid4().hex}"
            pieces = self.run_batch((prompt, max_tokens))
            if not body.get("stream"):
                text = "".join([piece async for piece in pieces])
                return JSONResponse(completion_body(request_id, model, text, count_tokens(prompt), count_tokens(text)))

            async def events():
                async for piece in pieces:
                    if piece:
                        yield chunk_event(request_id, model, piece, None)
                yield chunk_event(request_id, model, "", "length")
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

    return SimCompletions.bind()


class RayPeer:
    """Starts a private Ray (no dashboard), the batch counter and the Serve app; ``stop`` tears all of it down."""

    def __init__(self, cfg: PeerConfig, temp_dir: str = "/tmp/ray-llmq-bench") -> None:
        self.cfg = cfg
        self.temp_dir = temp_dir
        self.counter = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.cfg.port}/v1"

    def start(self, attempts: int = 5) -> None:
        """Start Ray on this machine's CPUs and deploy; returns once the replicas are ready.

        Ray gives its raylet a fixed 30 s to register at start, which a busy machine can miss: up to ``attempts`` tries.
        """
        for attempt in range(1, attempts + 1):
            try:
                self._start()
                return
            except Exception:
                self.stop()
                if attempt == attempts:
                    raise

    def _start(self) -> None:
        import ray
        from ray import serve

        ray.init(
            include_dashboard=False,
            namespace=NAMESPACE,
            _node_ip_address="127.0.0.1",
            _temp_dir=self.temp_dir,
            log_to_driver=False,
            logging_level="WARNING",
        )
        self.counter = ray.remote(num_cpus=0)(BatchCounter).options(name=COUNTER_NAME, namespace=NAMESPACE).remote()
        serve.start(http_options={"host": "127.0.0.1", "port": self.cfg.port}, logging_config={"log_level": "WARNING"})
        self.redeploy(self.cfg)

    def redeploy(self, cfg: PeerConfig) -> None:
        """Replace the app with one of another shape (e.g. another batch time), keeping Ray and the counter."""
        from ray import serve

        self.cfg = cfg
        serve.run(build_app(cfg), name=APP_NAME, route_prefix="/", blocking=False)

    def batch_counts(self) -> tuple[int, int]:
        """(batches, requests) run by every replica so far."""
        import ray

        return ray.get(self.counter.read.remote())

    def stop(self) -> None:
        """Tear down the Serve app and this process's Ray (a no-op when Ray is not up)."""
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


class BatchCounter:
    """Totals of the batches the replicas ran (a Ray actor: replicas add, the bench reads)."""

    def __init__(self) -> None:
        self.batches = 0
        self.requests = 0

    def add(self, size: int) -> None:
        self.batches += 1
        self.requests += size

    def read(self) -> tuple[int, int]:
        return self.batches, self.requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--batch-time-ms", type=int, default=500)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.02)
    args = parser.parse_args()
    peer = RayPeer(
        PeerConfig(
            replicas=args.replicas,
            max_batch_size=args.max_batch_size,
            batch_time_ms=args.batch_time_ms,
            batch_wait_timeout_s=args.batch_wait_timeout_s,
            port=args.port,
        )
    )
    peer.start()
    print(f"Ray Serve peer on {peer.base_url}; Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        peer.stop()


if __name__ == "__main__":
    main()

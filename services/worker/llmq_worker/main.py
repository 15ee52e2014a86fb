"""Worker process: ``python -m llmq_worker.main --worker-id W --partition P --model NAME --engine {simulated,transformers,vllm}``.

Wiring only: settings, logging, engine, Kafka/Redis clients, signals, then :class:`~llmq_worker.loop.WorkerLoop`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging

from llmq_core import metrics, runtime
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.constants import worker_group
from llmq_core.kafka import make_consumer, make_renewable_producer, require_topic_limits
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings, load_settings
from llmq_worker import checkpoints
from llmq_worker.core import WorkerCore
from llmq_worker.engine import Engine
from llmq_worker.loop import WorkerLoop

log = logging.getLogger("llmq_worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmq_worker", description="Run one llmq worker on one partition of llmq.batches"
    )
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--partition", type=int, required=True)
    parser.add_argument("--model", required=True, help="model name served, e.g. llmq-sim or llmq-tiny")
    parser.add_argument("--engine", choices=["simulated", "transformers", "vllm"], required=True)
    parser.add_argument("--batch-time-ms", type=int, default=500, help="simulated: time of any batch")
    parser.add_argument(
        "--max-batch-size", type=int, default=None, help="simulated: requests per batch (default: model's)"
    )
    parser.add_argument(
        "--poison-marker", default=None, help="simulated, for tests: a batch whose prompt holds it fails"
    )
    parser.add_argument(
        "--model-path",
        default=None,
        help="transformers, vllm: HF causal-LM checkpoint dir (transformers default: the catalogue model's installed"
        " checkpoint, or llmq-tiny built in code)",
    )
    parser.add_argument(
        "--gguf-file",
        default=None,
        help="transformers: a GGUF file in --model-path to serve (any architecture transformers reads from GGUF)",
    )
    parser.add_argument(
        "--max-concurrent-sequences", type=int, default=None, help="transformers, vllm: running sequences, at most"
    )
    parser.add_argument(
        "--max-batched-tokens", type=int, default=None, help="transformers, vllm: tokens per forward step, at most"
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="vllm: share of GPU memory it may take"
    )
    parser.add_argument(
        "--device", default=None, help="transformers: torch device (default: cuda if available, else cpu)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off; default LLMQ_METRICS_PORT)"
    )
    return parser.parse_args(argv)


def build_engine(args: argparse.Namespace, settings: Settings | None = None) -> Engine:
    """The engine the arguments select; transformers and vllm are imported only when chosen. A catalogue model with a
    packaged checkpoint is served from its installed directory, verified first (SystemExit saying what is wrong)."""
    settings = settings or load_settings()
    spec = BUILTIN_MODELS.get(args.model)
    if args.gguf_file is not None and (args.model_path is None or args.engine != "transformers"):
        raise SystemExit("--gguf-file needs --engine transformers and --model-path (the directory holding it)")
    if args.model_path is None and args.engine != "simulated" and spec is not None and spec.source is not None:
        try:
            args.model_path = str(checkpoints.installed_path(spec, checkpoints.models_root(settings.models_dir)))
        except checkpoints.CheckpointError as exc:
            raise SystemExit(str(exc)) from None
    if args.engine == "simulated":
        return _simulated(args, spec)
    if args.engine == "vllm":
        return _vllm(args, spec)
    from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs

    route_library_logs()
    return TransformersEngine.from_args(
        model_path=args.model_path,
        max_concurrent_sequences=args.max_concurrent_sequences or (spec.max_batch_size if spec else 32),
        max_batched_tokens=args.max_batched_tokens,
        device=args.device,
        gguf_file=args.gguf_file,
        torch_threads=settings.torch_threads,
    )


def _vllm(args: argparse.Namespace, spec) -> Engine:
    if args.model_path is None:
        raise SystemExit("--engine vllm needs --model-path (a HF checkpoint directory)")
    from llmq_worker.engines.vllm_engine import VllmEngine

    return VllmEngine.from_args(
        model_path=args.model_path,
        max_concurrent_sequences=args.max_concurrent_sequences or (spec.max_batch_size if spec else 64),
        max_batched_tokens=args.max_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


def _simulated(args: argparse.Namespace, spec) -> Engine:
    from llmq_worker.engines.simulated import SimulatedEngine

    return SimulatedEngine(
        max_batch_size=args.max_batch_size or (spec.max_batch_size if spec else 64),
        batch_time_ms=args.batch_time_ms,
        context_window=spec.context_window if spec else 8192,
        poison_marker=args.poison_marker,
    )


async def build(args: argparse.Namespace, settings: Settings, stack: contextlib.AsyncExitStack) -> runtime.Work:
    await require_topic_limits(settings)  # before loading a model: a result the broker refuses must not be computed
    engine = build_engine(args, settings)
    stack.push_async_callback(engine.close)
    observed = metrics.WorkerMetrics(args.model, settings.region)
    runtime.serve_metrics(stack, observed.registry, settings, args.metrics_port)
    redis = runtime.redis(stack, settings)
    producer = make_renewable_producer(settings)  # a refused result does not break it
    consumer = make_consumer(settings, group_id=worker_group(args.partition))
    await runtime.start(stack, producer, consumer)
    core = WorkerCore(
        worker_id=args.worker_id, partition=args.partition, model=args.model, engine=engine, clock=SYSTEM_CLOCK
    )
    worker = WorkerLoop(
        core=core,
        engine=engine,
        consumer=consumer,
        producer=producer,
        redis=redis,
        clock=SYSTEM_CLOCK,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        shutdown_grace_s=settings.shutdown_grace_s,
        max_pending=4 * engine.capacity().max_slots,
        metrics=observed,
    )
    log.info("worker %s serving %s on partition %d", args.worker_id, args.model, args.partition)
    stop = asyncio.Event()
    # The loop drains within shutdown_grace_s itself, and its heartbeat refreshes the alive key (with its load).
    return runtime.Work(
        tasks=[worker.run(stop)],
        stop=stop.set,
        grace_s=None,
        helpers=[observed.lag.watch(consumer, worker_group(args.partition))],
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.worker_id = runtime.regional(args.worker_id)
    runtime.run(lambda: runtime.serve("worker", args.worker_id, functools.partial(build, args)))


if __name__ == "__main__":
    main()

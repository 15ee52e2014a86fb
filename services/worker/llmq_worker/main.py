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
from llmq_core.constants import worker_group
from llmq_core.kafka import make_consumer, make_renewable_producer, require_topic_limits
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings, WorkerSettings, env_name
from llmq_worker import checkpoints
from llmq_worker.engine import Engine
from llmq_worker.lease import PartitionLease, this_process
from llmq_worker.loop import WorkerLoop
from llmq_worker.prefix_cache import PrefixLedger

log = logging.getLogger("llmq_worker")


# The settings groups a worker reads (validated at start; a bad value elsewhere is no concern of it)
GROUPS = ("region", "kafka", "redis", "models", "worker", "batcher", "observability", "runtime")

# flag -> (WorkerSettings field, argparse options); each flag's default is its setting (env LLMQ_WORKER_<FIELD>)
_FLAGS: dict[str, tuple[str, dict]] = {
    "--worker-id": ("id", {}),
    "--partition": ("partition", {"type": int}),
    "--model": ("model", {}),
    "--engine": ("engine", {"choices": ["simulated", "transformers", "vllm"]}),
    "--batch-time-ms": ("batch_time_ms", {"type": int}),
    "--prefill-ms-per-token": ("prefill_ms_per_token", {"type": float}),
    "--max-batch-size": ("max_batch_size", {"type": int}),
    "--poison-marker": ("poison_marker", {}),
    "--model-path": ("model_path", {}),
    "--gguf-file": ("gguf_file", {}),
    "--max-concurrent-sequences": ("max_concurrent_sequences", {"type": int}),
    "--max-batched-tokens": ("max_batched_tokens", {"type": int}),
    "--gpu-memory-utilization": ("gpu_memory_utilization", {"type": float}),
    "--device": ("device", {}),
    "--metrics-port": ("metrics_port", {"type": int}),
}
_REQUIRED = ("--worker-id", "--partition", "--model", "--engine")


def parse_args(argv: list[str] | None = None, worker: WorkerSettings | None = None) -> argparse.Namespace:
    """The worker's flags; each one not given is its field of ``worker`` (default: WorkerSettings from the
    environment). ``--worker-id``, ``--partition``, ``--model`` and ``--engine`` are required unless set there."""
    worker = worker if worker is not None else WorkerSettings.from_env()
    parser = argparse.ArgumentParser(
        prog="llmq_worker", description="Run one llmq worker on one partition of llmq.batches"
    )
    fields = WorkerSettings.model_fields
    for flag, (name, options) in _FLAGS.items():
        default = getattr(worker, name)
        missing = default is None or default == ""
        parser.add_argument(
            flag,
            dest=name if name != "id" else "worker_id",
            default=None if missing else default,
            required=flag in _REQUIRED and missing,
            help=f"{fields[name].description.removeprefix(f'{flag}: ')} (env {env_name(WorkerSettings, name)})",
            **options,
        )
    return parser.parse_args(argv)


def build_engine(args: argparse.Namespace, settings: Settings | None = None) -> Engine:
    """The engine the arguments select; transformers and vllm are imported only when chosen. A catalogue model with a
    packaged checkpoint is served from its installed directory, verified first (SystemExit saying what is wrong)."""
    settings = settings or Settings()
    spec = BUILTIN_MODELS.get(args.model)
    if args.gguf_file is not None and (args.model_path is None or args.engine != "transformers"):
        raise SystemExit("--gguf-file needs --engine transformers and --model-path (the directory holding it)")
    if args.model_path is None and args.engine != "simulated" and spec is not None and spec.source is not None:
        try:
            args.model_path = str(checkpoints.installed_path(spec, checkpoints.models_root(settings.models.dir)))
        except checkpoints.CheckpointError as exc:
            raise SystemExit(str(exc)) from None
    if args.engine == "simulated":
        return _simulated(args, spec, settings)
    if args.engine == "vllm":
        return _vllm(args, spec, settings)
    from llmq_worker.engines.transformers_engine import TransformersEngine, route_library_logs

    route_library_logs()
    return TransformersEngine.from_args(
        model_path=args.model_path,
        max_concurrent_sequences=args.max_concurrent_sequences or (spec.max_batch_size if spec else 32),
        max_batched_tokens=args.max_batched_tokens,
        device=args.device,
        gguf_file=args.gguf_file,
        torch_threads=settings.worker.torch_threads,
        constrained_decoding=settings.worker.constrained_decoding,
        prefix_ledger=PrefixLedger.from_settings(settings.worker),
        max_preemptions=settings.worker.max_preemptions,
        preemption_min_slack_ms=settings.worker.preemption_min_slack_ms,
    )


def _vllm(args: argparse.Namespace, spec, settings: Settings) -> Engine:
    if args.model_path is None:
        raise SystemExit("--engine vllm needs --model-path (a HF checkpoint directory)")
    from llmq_worker.engines.vllm_engine import VllmEngine

    return VllmEngine.from_args(
        model_path=args.model_path,
        max_concurrent_sequences=args.max_concurrent_sequences or (spec.max_batch_size if spec else 64),
        max_batched_tokens=args.max_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        prefix_ledger=PrefixLedger.from_settings(settings.worker),
    )


def _simulated(args: argparse.Namespace, spec, settings: Settings) -> Engine:
    from llmq_worker.engines.simulated import SimulatedEngine

    return SimulatedEngine(
        max_batch_size=args.max_batch_size or (spec.max_batch_size if spec else 64),
        batch_time_ms=args.batch_time_ms,
        context_window=spec.context_window if spec else 8192,
        poison_marker=args.poison_marker,
        prefill_ms_per_token=args.prefill_ms_per_token,
        prefix_ledger=PrefixLedger.from_settings(settings.worker),
    )


async def build(args: argparse.Namespace, settings: Settings, stack: contextlib.AsyncExitStack) -> runtime.Work:
    await require_topic_limits(settings)  # before loading a model: a result the broker refuses must not be computed
    engine = build_engine(args, settings)
    stack.push_async_callback(engine.close)
    observed = metrics.WorkerMetrics(args.model, settings.region.name)
    observed.watch_grammars(getattr(engine, "grammar_stats", None))
    observed.watch_preemptions(getattr(engine, "preemption_stats", None))
    observed.watch_prefix_cache(engine.prefix_ledger)
    runtime.serve_metrics(stack, observed.registry, settings, args.metrics_port)
    redis = runtime.redis(stack, settings)
    lease = PartitionLease(redis, args.partition, this_process(args.worker_id), settings.worker.lease_ttl_ms)
    await lease.acquire()  # a second worker given this partition waits here as its standby
    stack.push_async_callback(lease.release)  # after the consumer stopped (the stack closes in reverse)
    producer = make_renewable_producer(settings)  # a refused result does not break it
    consumer = make_consumer(settings, group_id=worker_group(args.partition))
    await runtime.start(stack, producer, consumer)
    worker = WorkerLoop.build(
        engine,
        consumer,
        producer,
        redis,
        settings,
        worker_id=args.worker_id,
        partition=args.partition,
        model=args.model,
        metrics=observed,
    )
    log.info("worker %s serving %s on partition %d", args.worker_id, args.model, args.partition)
    stop = asyncio.Event()
    # The loop drains within shutdown_grace_s itself, and its heartbeat refreshes the alive key (with its load).
    return runtime.Work(
        tasks=[worker.run(stop), lease.hold(stop)],  # a lost lease ends the worker
        stop=stop.set,
        grace_s=None,
        helpers=[observed.lag.watch(consumer, worker_group(args.partition))],
    )


def main(argv: list[str] | None = None) -> None:
    settings = runtime.service_settings(*GROUPS)
    args = parse_args(argv, settings.worker)
    args.worker_id = runtime.regional(args.worker_id, settings)
    runtime.run(lambda: runtime.serve("worker", args.worker_id, functools.partial(build, args), settings))


if __name__ == "__main__":
    main()
    runtime.exit_at_once()

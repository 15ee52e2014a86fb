"""Options more than one ``llmq`` command takes, declared once so a flag reads and behaves alike in each; the command
gives the default (``seed: Seed = 0``)."""

from __future__ import annotations

from typing import Annotated

import typer

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Seed = Annotated[int, typer.Option(help="Random seed: the same seed, the same run.")]
KafkaPort = Annotated[int, typer.Option(help="Kafka listener port (the controller takes the next one).")]
RedisPort = Annotated[int, typer.Option(help="Redis port.")]
ApiPort = Annotated[int, typer.Option(help="First API pod's port; the second pod takes the next one.")]
# the fixed-time batch engine that the simulator, the capacity math and the benchmarks model
MaxBatch = Annotated[int, typer.Option(help="Largest batch a worker runs.")]
BatchTimeMs = Annotated[int, typer.Option(help="Time of one batch, whatever its size.")]
DurationS = Annotated[float, typer.Option(help="Simulated seconds of arrivals.")]
# the benchmarks that compare llmq with Ray Serve on private stacks
Systems = Annotated[str, typer.Option(help="Systems to measure, one after the other: llmq (this checkout), ray.")]
PortBase = Annotated[
    int,
    typer.Option(
        help="Private ports: API +0/+1, metrics +10 to +15, Kafka +92 (+93), Redis +379, Ray Serve +500 (pipeline)."
    ),
]
# the batch-time model's prefill term (llmq_bench.batch_time): absent, every batch takes --batch-time-ms
PromptTokens = Annotated[
    int, typer.Option(help="Prompt tokens per request; > 0 adds prefill per uncached token to each batch's time.")
]
PrefillMsPerToken = Annotated[
    float, typer.Option(help="Prefill ms per uncached prompt token (default derived: docs/simulator.md).")
]
PrefixTokens = Annotated[int, typer.Option(help="Tokens of a shared prompt header, part of --prompt-tokens.")]
PrefixHitRate = Annotated[float, typer.Option(help="Share of requests (0..1) whose header is in the prefix cache.")]

"""Capacity curve of the simulated fixed-time model (seed 003, scaled to this machine): llmq, then Ray Serve.

Steps, all on this machine and one system at a time:
1. llmq's private stack with a ~0 ms batch time: pipeline overhead at light load, then the pipeline's saturation
   throughput (a rising open-loop ramp until it stops keeping up).
2. The batch time is chosen so that 110% of ideal capacity (workers x max batch / batch time) is at most half that
   saturation: the curve then measures batching, not the machine's cores.
3. llmq's stack restarted with that batch time; one open-loop point per offered load (25..110% of ideal capacity).
4. Ray Serve (``llmq_bench.ray_peer``) with the same replicas, batch size and batch times: the same probe and points.
5. ``capacity_curve.json`` and ``capacity_curve.png`` under ``bench/results/``; everything started here is stopped.

Run: ``llmq bench curve`` (the CLI starts the private stacks: ``llmq_bench`` imports no ``llmq_cli``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmq_bench import loadgen
from llmq_bench.prompts import CodePrompt, cut_prompts
from llmq_core.constants import STATS_BATCHER

PROBE_BATCH_TIME_MS = 1  # "~0": the engine adds nothing, so latency is the pipeline's own
SEED_SLO_OVER_BATCH = 600 / 250  # seed 003: p99 under 600 ms with 250 ms batches


@dataclass(frozen=True)
class CurveConfig:
    """What to measure. ``batch_time_ms`` 0: derived from ``saturation_rps`` (0: measured first)."""

    systems: tuple[str, ...] = ("llmq", "ray")
    batch_time_ms: int = 0
    saturation_rps: float = 0.0
    workers: int = 2
    max_batch_size: int = 16
    point_s: float = 25.0
    loads: tuple[float, ...] = (0.25, 0.5, 0.8, 0.95, 1.1)
    output: Path = Path("bench/results/capacity_curve.json")
    state_dir: Path = Path("var/bench")
    port_base: int = 35000
    classes: dict[str, float] = field(default_factory=lambda: {"interactive": 1.0})
    keys: dict[str, float] = field(default_factory=lambda: dict(loadgen.DEFAULT_KEYS))
    stream_share: float = 0.3
    ray_wait_ms: int = 0  # Ray's batch_wait_timeout_s; 0: the batch time (shorter waits queue batches, see ray_peer)
    probe_rps: float = 8.0
    probe_s: float = 12.0
    warmup_s: float = 3.0
    ramp_start_rps: float = 20.0
    ramp_factor: float = 1.5
    ramp_step_s: float = 6.0
    seed: int = 0


# --- pure parts ----------------------------------------------------------------------------------------------------


def ideal_capacity_rps(workers: int, max_batch_size: int, batch_time_ms: float) -> float:
    """Requests per second with every worker running full batches back to back."""
    return workers * max_batch_size * 1000 / batch_time_ms


def choose_batch_time_ms(
    saturation_rps: float,
    workers: int,
    max_batch_size: int,
    *,
    top_load: float = 1.1,
    share: float = 0.5,
    step_ms: int = 100,
    floor_ms: int = 1000,
) -> int:
    """Shortest batch time (a multiple of ``step_ms``, at least ``floor_ms``) whose ``top_load`` x ideal capacity is at
    most ``share`` x the pipeline's saturation throughput. Raises ValueError for a saturation that is not positive."""
    if saturation_rps <= 0:
        raise ValueError("saturation_rps must be positive")
    needed_ms = top_load * workers * max_batch_size * 1000 / (share * saturation_rps)
    return max(floor_ms, math.ceil(needed_ms / step_ms) * step_ms)


def ramp_rates(start_rps: float, factor: float, steps: int) -> list[float]:
    """Offered rates of the saturation ramp: ``start_rps`` times ``factor`` per step."""
    return [start_rps * factor**i for i in range(steps)]


def keeps_up(report: dict, *, min_ratio: float = 0.85) -> bool:
    """Whether a ramp step was served: throughput at least ``min_ratio`` of what was offered."""
    return report["throughput_rps"] >= min_ratio * report["offered_rps"]


def ramp_goes_on(report: dict, best_rps: float, *, min_gain: float = 1.05) -> bool:
    """Whether to offer more after a step: it kept up, or it still served ``min_gain`` x more than any earlier step
    (so one step slowed by other work on the machine does not end the ramp)."""
    return keeps_up(report) or report["throughput_rps"] > min_gain * best_rps


def overhead_ms(samples: Sequence[loadgen.Sample], engine_ms: float) -> dict[str, float]:
    """End-to-end latency minus engine time (ms) of the succeeded samples: p50 / p95 / p99 / mean."""
    return loadgen.quantiles_ms([s.e2e_ms - engine_ms for s in samples if s.status == loadgen.OK])


def point_figures(report: dict, load: float, batch_time_ms: float) -> dict:
    """One curve point: the figures compared (goodput / offered, p99 / batch time, batch fill) plus their context."""
    batches = report["batches"] or {}
    return {
        "load": load,
        "offered_rps": report["offered_rps"],
        "requests": report["requests"],
        "goodput_rps": report["goodput_rps"],
        "goodput_over_offered": report["goodput_ratio"],
        "throughput_rps": report["throughput_rps"],
        "p50_ms": report["latency_ms"]["p50"],
        "p99_ms": report["latency_ms"]["p99"],
        "p99_over_batch_time": report["latency_ms"]["p99"] / batch_time_ms,
        "ttft_p50_ms": report["ttft_ms"]["p50"],
        "ttft_p99_ms": report["ttft_ms"]["p99"],
        "mean_batch_size": batches.get("mean_size", 0.0),
        "batch_fill": batches.get("fill", 0.0),
        "rejected_429": report["rejected_429"],
        "timeouts_504": report["timeouts_504"],
        "status": report["status"],
        "tenants": {
            key: {
                "requests": t["requests"],
                "goodput_over_offered": t["good"] / t["requests"],
                "p99_ms": t["latency_ms"]["p99"],
                "rejected_429": t["rejected_429"],
            }
            for key, t in report.get("tenants", {}).items()
            if t["requests"]
        },
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def compare(llmq_points: Sequence[dict], ray_points: Sequence[dict]) -> list[dict]:
    """Per load point: llmq p99 / Ray p99 and llmq goodput / Ray goodput (None where Ray's figure is 0)."""
    return [
        {
            "load": a["load"],
            "p99_llmq_over_ray": _ratio(a["p99_ms"], b["p99_ms"]),
            "goodput_llmq_over_ray": _ratio(a["goodput_rps"], b["goodput_rps"]),
            "fill_llmq_over_ray": _ratio(a["batch_fill"], b["batch_fill"]),
        }
        for a, b in zip(llmq_points, ray_points)
    ]


# --- measuring -----------------------------------------------------------------------------------------------------


class Runner:
    """Runs open-loop loads with one config's mix and prompts against one system's base URLs."""

    def __init__(
        self,
        cfg: CurveConfig,
        prompts: Sequence[CodePrompt],
        base_urls: Sequence[str],
        batch_counts: Callable[[], tuple[int, int]] | None,
    ) -> None:
        self.cfg, self.prompts, self.base_urls, self.batch_counts = cfg, prompts, base_urls, batch_counts

    def plans(self, rate_rps: float, window_s: float) -> list[loadgen.Planned]:
        """The schedule of one load: the same for every system (seeded by the config's seed, rate and window)."""
        rng = random.Random(f"{self.cfg.seed}:{rate_rps:.6f}:{window_s:g}")
        arrivals = loadgen.poisson_arrivals(rate_rps, count=10**6, duration_s=window_s, rng=rng)
        return loadgen.plan_requests(
            self.prompts,
            arrivals,
            classes=self.cfg.classes,
            keys=self.cfg.keys,
            stream_share=self.cfg.stream_share,
            base_urls=self.base_urls,
            rng=rng,
        )

    def run(self, rate_rps: float, window_s: float, slo_ms: float) -> tuple[dict, list[loadgen.Sample]]:
        """(report, samples) of ``window_s`` of Poisson arrivals at ``rate_rps``, waiting for every answer."""
        before = self.batch_counts() if self.batch_counts else None
        samples = asyncio.run(loadgen.run_load(self.plans(rate_rps, window_s), model="llmq-sim", timeout_s=60.0))
        delta = None
        if before is not None:
            delta = loadgen.batch_delta(self.batch_counts, before, sum(s.status == "ok" for s in samples))
        report = loadgen.summarize(
            samples, window_s=window_s, slo_ms=slo_ms, batch_delta=delta, max_batch_size=self.cfg.max_batch_size
        )
        return report, samples


def probe_overhead(runner: Runner, log: Callable[[str], None]) -> dict:
    """Light load against a ~0 ms engine: latency there is the pipeline's own overhead (after a discarded warm-up)."""
    cfg = runner.cfg
    runner.run(cfg.probe_rps, cfg.warmup_s, slo_ms=math.inf)
    report, samples = runner.run(cfg.probe_rps, cfg.probe_s, slo_ms=math.inf)
    result = {
        "offered_rps": report["offered_rps"],
        "requests": report["requests"],
        "succeeded": report["succeeded"],
        "engine_ms": PROBE_BATCH_TIME_MS,
        "overhead_ms": overhead_ms(samples, PROBE_BATCH_TIME_MS),
    }
    log(
        f"  overhead at {report['offered_rps']:.1f} req/s: p50 {result['overhead_ms']['p50']:.0f} ms, "
        f"p99 {result['overhead_ms']['p99']:.0f} ms ({report['succeeded']}/{report['requests']} ok)"
    )
    return result


def measure_saturation(runner: Runner, log: Callable[[str], None], max_steps: int = 12) -> dict:
    """Open-loop ramp until the pipeline stops keeping up and serves no more than before; saturation = the highest
    throughput any step reached. ``max_steps`` 12 tops out near 1,700 req/s (20 x 1.5^11): 8 steps (339 req/s) was
    the limit of the httpx load generator, no longer of the pipeline, which served all 339."""
    cfg, steps = runner.cfg, []
    for rate in ramp_rates(cfg.ramp_start_rps, cfg.ramp_factor, max_steps):
        report, _ = runner.run(rate, cfg.ramp_step_s, slo_ms=math.inf)
        best_rps = max((s["throughput_rps"] for s in steps), default=0.0)
        steps.append(
            {
                "offered_rps": report["offered_rps"],
                "throughput_rps": report["throughput_rps"],
                "p50_ms": report["latency_ms"]["p50"],
                "p99_ms": report["latency_ms"]["p99"],
                "succeeded": report["succeeded"],
                "requests": report["requests"],
            }
        )
        log(
            f"  ramp {report['offered_rps']:.0f} req/s offered -> {report['throughput_rps']:.0f} req/s served, "
            f"p50 {report['latency_ms']['p50']:.0f} ms"
        )
        if not ramp_goes_on(report, best_rps):
            break
    return {"saturation_rps": max(s["throughput_rps"] for s in steps), "steps": steps}


def run_points(runner: Runner, batch_time_ms: int, log: Callable[[str], None]) -> dict:
    """One open-loop point per load of the config; also e2e minus batch time at the lightest point."""
    cfg = runner.cfg
    ideal = ideal_capacity_rps(cfg.workers, cfg.max_batch_size, batch_time_ms)
    slo_ms = SEED_SLO_OVER_BATCH * batch_time_ms
    points, lightest = [], None
    runner.run(cfg.loads[0] * ideal, max(cfg.warmup_s, 3 * batch_time_ms / 1000), slo_ms)  # warm-up, discarded
    for load in cfg.loads:
        report, samples = runner.run(load * ideal, cfg.point_s, slo_ms)
        point = point_figures(report, load, batch_time_ms)
        points.append(point)
        lightest = lightest or {"load": load, "minus_batch_time_ms": overhead_ms(samples, batch_time_ms)}
        log(
            f"  {load:.0%} ({point['offered_rps']:.1f} req/s): goodput/offered {point['goodput_over_offered']:.2f}, "
            f"p99/batch {point['p99_over_batch_time']:.2f}, fill {point['batch_fill']:.0%}, "
            f"429 {point['rejected_429']}, 504 {point['timeouts_504']}"
        )
    return {"points": points, "lightest_point": lightest, "slo_ms": slo_ms}


class PrivateStack(Protocol):
    """A private llmq stack (``llmq_cli.devstack.DevStack``): the CLI that runs the curve makes it."""

    cfg: Any  # api_ports, redis_url

    def up(self, *, log: Callable[[str], None]) -> None: ...

    def down(self, *, services_only: bool = False) -> None: ...


StackFactory = Callable[[int], PrivateStack]  # simulated batch time (ms) -> the private stack running it


def measure_llmq(
    cfg: CurveConfig, prompts: Sequence[CodePrompt], stack: StackFactory, log: Callable[[str], None]
) -> tuple[dict, int]:
    """llmq's overhead probe, saturation (unless given) and points; returns (figures, batch time used)."""
    probe_stack = stack(PROBE_BATCH_TIME_MS)
    base_urls = [f"http://127.0.0.1:{port}/v1" for port in probe_stack.cfg.api_ports]
    redis_url = probe_stack.cfg.redis_url
    runner = Runner(cfg, prompts, base_urls, lambda: loadgen.batch_counts(redis_url, STATS_BATCHER))
    figures: dict = {}
    try:
        log(f"llmq: starting the private stack ({cfg.workers} sim workers, {PROBE_BATCH_TIME_MS} ms batches)")
        probe_stack.up(log=lambda _line: None)
        figures["light_load"] = probe_overhead(runner, log)
        saturation = {"saturation_rps": cfg.saturation_rps, "steps": [], "given": True}
        if not cfg.batch_time_ms and not cfg.saturation_rps:
            saturation = measure_saturation(runner, log)
        figures["saturation"] = saturation
        batch_time_ms = cfg.batch_time_ms or choose_batch_time_ms(
            saturation["saturation_rps"], cfg.workers, cfg.max_batch_size
        )
        log(f"llmq: restarting the services with {batch_time_ms} ms batches")
        probe_stack.down(services_only=True)
        stack(batch_time_ms).up(log=lambda _line: None)
        figures.update(run_points(runner, batch_time_ms, log))
    finally:
        probe_stack.down()
    return figures, batch_time_ms


def measure_ray(
    cfg: CurveConfig, prompts: Sequence[CodePrompt], batch_time_ms: int, log: Callable[[str], None]
) -> dict:
    """Ray Serve's overhead probe and points with the same replicas, batch size and batch time."""
    from llmq_bench.ray_peer import PeerConfig, RayPeer

    def peer_cfg(batch_ms: int) -> PeerConfig:
        return PeerConfig(
            replicas=cfg.workers,
            max_batch_size=cfg.max_batch_size,
            batch_time_ms=batch_ms,
            batch_wait_timeout_s=(cfg.ray_wait_ms or batch_ms) / 1000,
            port=cfg.port_base + 500,
        )

    peer = RayPeer(peer_cfg(PROBE_BATCH_TIME_MS))
    runner = Runner(cfg, prompts, [peer.base_url], peer.batch_counts)
    figures: dict = {}
    try:
        log(f"ray: starting Ray Serve ({cfg.workers} replicas, {PROBE_BATCH_TIME_MS} ms batches)")
        peer.start()
        figures["light_load"] = probe_overhead(runner, log)
        log(f"ray: redeploying with {batch_time_ms} ms batches")
        peer.redeploy(peer_cfg(batch_time_ms))
        figures.update(run_points(runner, batch_time_ms, log))
    finally:
        peer.stop()
    return figures


def run_curve(cfg: CurveConfig, stack: StackFactory, log: Callable[[str], None] = print) -> dict:
    """Measure every system of ``cfg`` in turn (llmq on the stacks ``stack`` makes), write the JSON and the PNG, and return the result."""
    unknown = set(cfg.systems) - {"llmq", "ray"}
    if unknown or not cfg.systems:
        raise ValueError(f"systems must be llmq and/or ray, got {cfg.systems}")
    if "llmq" not in cfg.systems and not cfg.batch_time_ms:
        raise ValueError("without llmq (which measures the saturation) a --batch-time-ms is needed")
    prompts = cut_prompts(300, seed=cfg.seed)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the finally blocks stop what this run started
    started = time.time()
    result: dict = {
        "config": {**asdict(cfg), "output": str(cfg.output), "state_dir": str(cfg.state_dir)},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
        "started_at": started,
        "systems": {},
    }
    batch_time_ms = cfg.batch_time_ms
    if "llmq" in cfg.systems:
        result["systems"]["llmq"], batch_time_ms = measure_llmq(cfg, prompts, stack, log)
    if "ray" in cfg.systems:
        try:
            result["systems"]["ray"] = measure_ray(cfg, prompts, batch_time_ms, log)
        except Exception as exc:  # keep what llmq measured; the caller sees the failure in "failed"
            log(f"ray: failed: {exc!r}")
            result["failed"] = {"ray": repr(exc)}
    ideal = ideal_capacity_rps(cfg.workers, cfg.max_batch_size, batch_time_ms)
    result.update(
        batch_time_ms=batch_time_ms,
        ideal_capacity_rps=ideal,
        wall_s=time.time() - started,
        loadavg_at_end=os.getloadavg(),
    )
    if {"llmq", "ray"} <= set(result["systems"]):
        result["ratios"] = compare(result["systems"]["llmq"]["points"], result["systems"]["ray"]["points"])
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, cfg.output.with_suffix(".png"))
    log(f"wrote {cfg.output} and {cfg.output.with_suffix('.png')} in {result['wall_s']:.0f}s")
    return result


def _exit_on_sigterm(signum, _frame) -> None:
    raise SystemExit(128 + signum)


# --- output --------------------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    """Three panels over offered load (% of ideal capacity): goodput / offered, p99 / batch time, batch fill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("goodput_over_offered", "goodput / offered"),
        ("p99_over_batch_time", "p99 / batch time"),
        ("batch_fill", "batch fill (mean size / max)"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for system, figures in result["systems"].items():
        loads = [100 * p["load"] for p in figures["points"]]
        for ax, (key, label) in zip(axes, panels):
            ax.plot(loads, [p[key] for p in figures["points"]], marker="o", label=system)
            ax.set_xlabel("offered load, % of ideal capacity")
            ax.set_title(label)
            ax.grid(alpha=0.3)
    axes[0].legend()
    cfg = result["config"]
    fig.suptitle(
        f"llmq-sim, {cfg['workers']} workers x batch {cfg['max_batch_size']}, "
        f"{result['batch_time_ms']} ms per batch (ideal {result['ideal_capacity_rps']:.1f} req/s); "
        f"one run on a shared {result['machine']['cpus']}-core machine"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_curve(result: dict, console) -> None:
    """The curve as a rich table: per load point, each system's figures and the llmq / Ray ratios."""
    from rich.table import Table

    systems = list(result["systems"])
    table = Table(
        "load",
        *(f"{s} {col}" for s in systems for col in ("good/offered", "p99/batch", "fill")),
        *(("p99 llmq/ray", "goodput llmq/ray") if "ratios" in result else ()),
        title=f"capacity curve: {result['batch_time_ms']} ms batches, ideal {result['ideal_capacity_rps']:.1f} req/s",
    )
    ratios = result.get("ratios", [])
    for i, load in enumerate(result["config"]["loads"]):
        cells = [f"{load:.0%}"]
        for system in systems:
            p = result["systems"][system]["points"][i]
            cells += [f"{p['goodput_over_offered']:.2f}", f"{p['p99_over_batch_time']:.2f}", f"{p['batch_fill']:.0%}"]
        if ratios:
            cells += [_fmt(ratios[i]["p99_llmq_over_ray"]), _fmt(ratios[i]["goodput_llmq_over_ray"])]
        table.add_row(*cells)
    console.print(table)
    for system in systems:
        light = result["systems"][system]["light_load"]["overhead_ms"]
        console.print(
            f"{system}: pipeline overhead at light load (e2e - engine time): p50 {light['p50']:.0f} ms, "
            f"p99 {light['p99']:.0f} ms"
        )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"

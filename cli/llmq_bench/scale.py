"""``llmq bench scale``: the fleet-scale overload of issue 28 with 1, 2, 3... batchers (and as many result-routers),
one private stack per count, side by side.

Each stack: two ``llmq-sim`` workers (64 per 500 ms: 256 requests/s), two API pods, N batchers, N result-routers. Each
run: a short warm-up, then the open-loop Poisson overload of :mod:`llmq_bench.loadgen` (by default 380 requests/s for
30 s, interactive, half paid and half free, none streamed), with every process's CPU (``/proc/<pid>/stat``, children
included) and the fleet's batch counters (``llmq:stats:batcher``) read before and after. The row of a run: paid
answered and within the SLO, paid p50/p99, free answered/429/504, goodput, throughput, Kafka batch fill, CPU ms per
answered request per process kind and the answered requests/s one core of that kind would carry. The goals compare
each count with the first (issue 28: paid p99 at most 1.25x, goodput and fill at least 0.9x, no paid 429 or 504).

``feeds`` picks what loads each stack, one after the other: ``http`` (the above, through the API pods) and ``kafka``
(:mod:`llmq_bench.direct_feed`: the same arrivals as interactive paid requests produced straight to Kafka, so the
batcher's CPU per request is measured alone, without the API pods and the load generator on the machine). A CPU profile
for ``llmq capacity --cpu-profile`` is measured below saturation: ``llmq bench scale --batchers 1 --rate 150 --count
4500 --feeds http,kafka --output bench/results/scale-profile.json`` (150 of the stack's 256 req/s).

The JSON also says what hashing the prompts' prefixes costs a batcher per request (``prefix_hash``:
:mod:`llmq_bench.prefix_cost`, measured in this process on the prompts sent), with its share of each run's batcher CPU.

Pure parts (:func:`cpu_by_kind`, :func:`row`, :func:`ratios`, :func:`goals`) are apart from the stacks
(:func:`run_scale`), so they can be tested alone.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from llmq_bench import direct_feed, loadgen, pipeline, prefix_cost
from llmq_bench.prompts import CodePrompt
from llmq_core import constants, kafka

PAID_KEY = "llmq-dev-key"
FREE_KEY = "llmq-dev-free-key"
KINDS = ("api", "batcher", "worker", "result-router", "kafka", "redis")
FEEDS = ("http", "kafka")  # through the API pods; straight to Kafka (the batcher alone)
GROUP_SETTLE_TIMEOUT_S = 120.0
# issue 28's goals for N batchers against one: paid p99 at most this ratio, goodput and batch fill at least these
P99_RATIO_MAX = 1.25
GOODPUT_RATIO_MIN = 0.9
FILL_RATIO_MIN = 0.9


@dataclass(frozen=True)
class ScaleConfig:
    """The batcher counts to run, the overload (as ``llmq bench``'s flags), the warm-up before it, the stacks' shape."""

    batchers: tuple[int, ...] = (1, 2, 3)
    rate: float = 380.0
    count: int = 11_400
    duration_s: float = 30.0
    classes: str = "interactive=1"
    keys: str = f"{PAID_KEY}=0.5,{FREE_KEY}=0.5"
    stream_share: float = 0.0
    seed: int = 7
    slo_ms: float = 1500.0
    timeout_s: float = 60.0
    warmup: int = 100  # paid requests at WARMUP_RATE before the measured run; 0: none
    warmup_rate: float = 50.0
    idle_after_warmup_s: float = 5.0  # the warm-up's queues drain before the overload starts
    sim_workers: int = 2
    sim_batch_time_ms: int = 500
    sim_max_batch_size: int = 64
    model: str = "llmq-sim"
    output: Path = Path("bench/results/scale.json")
    feeds: tuple[str, ...] = ("http",)  # of FEEDS, each run on every stack in turn


# --- pure parts ----------------------------------------------------------------------------------------------------


def cpu_by_kind(kinds: dict[str, str], before: dict[str, float], after: dict[str, float], answered: int) -> dict:
    """Per process kind (``kinds``: process name -> kind): processes, CPU seconds used, CPU ms per answered request
    (all its processes together: what one request costs that kind) and answered requests/s per core (1000 / that)."""
    out: dict[str, dict] = {}
    for name, kind in kinds.items():
        if name not in before or name not in after:
            continue
        entry = out.setdefault(kind, {"processes": 0, "cpu_s": 0.0})
        entry["processes"] += 1
        entry["cpu_s"] += max(0.0, after[name] - before[name])
    for entry in out.values():
        ms = entry["cpu_s"] * 1000 / answered if answered else 0.0
        entry["cpu_s"] = round(entry["cpu_s"], 3)
        entry["ms_per_request"] = round(ms, 4)
        entry["requests_per_s_per_core"] = round(1000 / ms, 1) if ms else None
    return dict(sorted(out.items(), key=lambda item: KINDS.index(item[0]) if item[0] in KINDS else len(KINDS)))


def row(batchers: int, report: dict, cpu: dict) -> dict:
    """The figures of one run (a :func:`loadgen.summarize` report and :func:`cpu_by_kind`'s), flat."""
    tenants = report["tenants"]
    none = loadgen.group_figures([], report["slo_ms"])
    paid, free = tenants.get(PAID_KEY, none), tenants.get(FREE_KEY, none)
    batches = report.get("batches") or {}
    return {
        "batchers": batchers,
        "requests": report["requests"],
        "paid_requests": paid["requests"],
        "paid_answered": paid["succeeded"],
        "paid_within_slo": paid["good"],
        "paid_429": paid["rejected_429"],
        "paid_504": paid["timeouts_504"],
        "paid_p50_ms": paid["latency_ms"]["p50"],
        "paid_p99_ms": paid["latency_ms"]["p99"],
        "free_answered": free["succeeded"],
        "free_429": free["rejected_429"],
        "free_504": free["timeouts_504"],
        "goodput_rps": round(report["goodput_rps"], 1),
        "throughput_rps": round(report["throughput_rps"], 1),
        "batch_fill": round(batches["fill"], 3) if batches else None,
        **cpu_figures(cpu),
    }


RATIO_FIELDS = ("paid_p99_ms", "goodput_rps", "batch_fill", "throughput_rps", "paid_within_slo")


def ratios(rows: Sequence[dict]) -> list[dict]:
    """Each row's :data:`RATIO_FIELDS` over the first row's (its batcher count against the first); None where the
    first is 0 or missing. CPU per request per kind too, since the machine's load cancels out of a ratio best."""
    first = rows[0]
    out = []
    for r in rows[1:]:
        entry = {"batchers": r["batchers"], "against": first["batchers"]}
        for name in RATIO_FIELDS:
            entry[name] = _ratio(r[name], first[name])
        entry["cpu_ms_per_request"] = {
            kind: _ratio(ms, first["cpu_ms_per_request"].get(kind)) for kind, ms in r["cpu_ms_per_request"].items()
        }
        out.append(entry)
    return out


def _ratio(value, base) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def goals(rows: Sequence[dict]) -> list[dict]:
    """Issue 28's goals for each count against the first: paid p99 ratio <= 1.25, goodput and fill >= 0.9, no paid 429
    or 504 (the first count's own paid 429/504 are checked too)."""
    out = [{"batchers": rows[0]["batchers"], "no_paid_429_or_504": rows[0]["paid_429"] + rows[0]["paid_504"] == 0}]
    for r, q in zip(rows[1:], ratios(rows), strict=True):
        out.append(
            {
                "batchers": r["batchers"],
                "paid_p99": q["paid_p99_ms"] is not None and q["paid_p99_ms"] <= P99_RATIO_MAX,
                "goodput": q["goodput_rps"] is not None and q["goodput_rps"] >= GOODPUT_RATIO_MIN,
                "batch_fill": q["batch_fill"] is not None and q["batch_fill"] >= FILL_RATIO_MIN,
                "no_paid_429_or_504": r["paid_429"] + r["paid_504"] == 0,
            }
        )
    return out


def cpu_figures(cpu: dict) -> dict:
    """A row's CPU columns from :func:`cpu_by_kind`'s: ms per request and requests/s per core, per kind."""
    return {
        "cpu_ms_per_request": {kind: c["ms_per_request"] for kind, c in cpu.items()},
        "requests_per_s_per_core": {kind: c["requests_per_s_per_core"] for kind, c in cpu.items()},
    }


DIRECT_FIELDS = ("requests", "answered", "unanswered", "offered_rps", "throughput_rps")  # of a direct_feed summary


def direct_row(batchers: int, summary: dict, cpu: dict) -> dict:
    """The figures of one Kafka-fed run (a :func:`direct_feed.summarize` summary and :func:`cpu_by_kind`'s), flat."""
    latency = summary["latency_ms"]
    return {
        "batchers": batchers,
        "feed": "kafka",
        **{name: summary[name] for name in DIRECT_FIELDS},
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        **cpu_figures(cpu),
    }


def result(config: ScaleConfig, runs: Sequence[dict], prefix_hash: dict | None = None) -> dict:
    """The JSON of a whole benchmark: its config, each run (row, report, CPU, machine), and the HTTP-fed runs' ratios
    and goals; ``prefix_hash``: what hashing its prompts' prefixes costs a batcher (:func:`prefix_cost.hash_cost`),
    with its share of each run's batcher CPU per request."""
    rows = [run["row"] for run in runs if run.get("feed", "http") == "http"]
    out = {
        "config": {**asdict(config), "output": str(config.output)},
        "runs": list(runs),
        "ratios": ratios(rows) if rows else [],
        "goals": goals(rows) if rows else [],
    }
    if prefix_hash is not None:
        shares = [
            prefix_cost.share_of(prefix_hash, run["row"].get("cpu_ms_per_request", {}).get("batcher")) for run in runs
        ]
        out["prefix_hash"] = {**prefix_hash, "share_of_batcher_cpu": shares}
    return out


# --- the stacks ----------------------------------------------------------------------------------------------------


def run_scale(
    config: ScaleConfig,
    stack_for: Callable[[int], object],
    prompts: Sequence[CodePrompt],
    base_urls: Sequence[str],
    log: Callable[[str], None] = print,
) -> dict:
    """Every count of ``config.batchers`` on its own stack (``stack_for(n)``, a DevStack: up, measured, down)."""
    runs = []
    for n in config.batchers:
        stack = stack_for(n)
        log(f"{n} batcher(s): starting a stack of {n} batchers and {n} result-routers")
        try:
            stack.up(timeout_s=300, log=lambda *_: None)
            runs.extend(measure(config, n, stack, prompts, base_urls, log))
        finally:
            stack.down()
    out = result(config, runs, prefix_cost.hash_cost([p.prompt for p in prompts]))
    pipeline.write_result(out, config.output)
    return out


def measure(config: ScaleConfig, n: int, stack, prompts: Sequence[CodePrompt], base_urls: Sequence[str], log) -> list:
    """Each of ``config.feeds`` in turn on ``n`` batchers' healthy ``stack``, once the group settled and the warm-up
    ran."""
    settings = stack.cfg.settings()
    asyncio.run(kafka.await_group(settings, constants.GROUP_BATCHER, n, GROUP_SETTLE_TIMEOUT_S))
    if config.warmup:
        log(f"{n} batcher(s): warm-up, {config.warmup} paid requests")
        warm = loadgen.poisson_arrivals(
            config.warmup_rate, count=config.warmup, duration_s=3600, rng=random.Random(config.seed)
        )
        plans = loadgen.plan_requests(
            prompts,
            warm,
            classes={"interactive": 1},
            keys={PAID_KEY: 1},
            stream_share=0,
            base_urls=base_urls,
            rng=random.Random(config.seed),
        )
        asyncio.run(loadgen.run_load(plans, model=config.model, timeout_s=config.timeout_s))
        time.sleep(config.idle_after_warmup_s)
    runs = []
    for feed in config.feeds:
        log(f"{n} batcher(s), fed by {feed}: {config.count} requests at most over {config.duration_s:g} s")
        if feed == "http":
            runs.append(measure_http(config, n, stack, prompts, base_urls))
        else:
            runs.append(measure_direct(config, n, stack, prompts))
    return runs


def measure_http(config: ScaleConfig, n: int, stack, prompts: Sequence[CodePrompt], base_urls: Sequence[str]) -> dict:
    """The overload through the API pods, with CPU and batch counters read around it."""
    rng = random.Random(config.seed)
    arrivals = loadgen.poisson_arrivals(config.rate, count=config.count, duration_s=config.duration_s, rng=rng)
    plans = loadgen.plan_requests(
        prompts,
        arrivals,
        classes=loadgen.parse_weights(config.classes),
        keys=loadgen.parse_weights(config.keys),
        stream_share=config.stream_share,
        base_urls=base_urls,
        rng=rng,
    )
    redis_url = stack.cfg.settings().redis.url
    counts_before = loadgen.batch_counts(redis_url, constants.STATS_BATCHER)
    outcome: dict = {}

    def load() -> int:
        outcome["samples"] = asyncio.run(loadgen.run_load(plans, model=config.model, timeout_s=config.timeout_s))
        return sum(s.status == loadgen.OK for s in outcome["samples"])

    measured = with_cpu(stack, load)
    samples, answered = outcome["samples"], measured.pop("answered")
    delta = loadgen.batch_delta(
        lambda: loadgen.batch_counts(redis_url, constants.STATS_BATCHER), counts_before, answered
    )
    report = loadgen.summarize(
        samples,
        window_s=loadgen.arrival_window_s(arrivals, config.count, config.duration_s),
        slo_ms=config.slo_ms,
        batch_delta=delta,
        max_batch_size=config.sim_max_batch_size,
    )
    own_s = measured.pop("own_cpu_s")
    return {
        "batchers": n,
        "feed": "http",
        "row": row(n, report, measured["cpu"]),
        **measured,
        "loadgen_cpu_ms_per_request": round(own_s * 1000 / len(samples), 4) if samples else 0.0,
        "report": report,
    }


def measure_direct(config: ScaleConfig, n: int, stack, prompts: Sequence[CodePrompt]) -> dict:
    """The same arrivals as interactive paid requests produced straight to Kafka (:mod:`llmq_bench.direct_feed`),
    with CPU read around them."""
    arrivals = loadgen.poisson_arrivals(
        config.rate, count=config.count, duration_s=config.duration_s, rng=random.Random(config.seed)
    )
    window_s = loadgen.arrival_window_s(arrivals, config.count, config.duration_s)
    outcome: dict = {}

    def load() -> int:
        outcome["summary"] = asyncio.run(
            direct_feed.run_feed(
                stack.cfg.settings(),
                arrivals,
                prompts,
                model=config.model,
                timeout_s=config.timeout_s,
                window_s=window_s,
            )
        )
        return outcome["summary"]["answered"]

    measured = with_cpu(stack, load)
    measured.pop("answered")
    own_s = measured.pop("own_cpu_s")
    summary = outcome["summary"]
    return {
        "batchers": n,
        "feed": "kafka",
        "row": direct_row(n, summary, measured["cpu"]),
        **measured,
        "loadgen_cpu_ms_per_request": round(own_s * 1000 / summary["requests"], 4) if summary["requests"] else 0.0,
        "summary": summary,
    }


def with_cpu(stack, load: Callable[[], int]) -> dict:
    """Run ``load`` (it returns the requests answered) with every live process's CPU, the machine's and this one's
    read around it: {answered, cpu (:func:`cpu_by_kind`), own_cpu_s, machine_busy_fraction, load_average, cores}."""
    rows = [r for r in stack.status() if r["health"] != "exited"]
    pids = {r["name"]: r["pid"] for r in rows}
    kinds = {r["name"]: r["kind"] for r in rows}
    load_before = os.getloadavg()[0]
    cpu_before, machine_before, own_before = pipeline.cpu_snapshot(pids), pipeline.machine_ticks(), time.process_time()
    answered = load()
    own_s = time.process_time() - own_before
    machine_after, cpu_after = pipeline.machine_ticks(), pipeline.cpu_snapshot(pids)
    return {
        "answered": answered,
        "cpu": cpu_by_kind(kinds, cpu_before, cpu_after, answered),
        "own_cpu_s": own_s,
        "machine_busy_fraction": pipeline.busy_fraction(machine_before, machine_after),
        # the machine is shared: its 1-minute load average as the run began and ended (cores: os.cpu_count())
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "cores": os.cpu_count(),
    }

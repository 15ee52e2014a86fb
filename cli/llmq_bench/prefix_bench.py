"""``llmq bench prefix``: prefix-aware dispatch against least-loaded on interleaved editing sessions (issue 31).

One private stack, N workers of one engine: ``sim`` (llmq-sim with a prefill term per uncached prompt token, so a
cached prefix shortens a batch) or ``real`` (smollm2-135m-instruct on the transformers engine). For each routing mode
in turn (``prefix``: the batchers' prefix-aware dispatch; ``least_loaded``: LLMQ_BATCHER_PREFIX_ROUTING=false) its
services start afresh (cold caches; Kafka and Redis stay), then the same seeded open-loop arrivals of
:func:`llmq_bench.prompts.session_prompts` (every prompt streamed, so TTFT is measured by the client) run. Each
worker's prefix-cache budget holds about 1/N of the sessions' distinct headers, with room for the prompts' tails
(``working_set_ratio``: the headers' tokens over one worker's budget, N / BUDGET_HEADROOM). A mode's row: prefix hit rate (the workers' hit over query tokens), TTFT and latency
p50/p90/p99, throughput, goodput within the SLO per class, the 429 and 503 shares, and the batchers' routing decisions
by reason. The pure parts (:func:`budget_tokens`, :func:`metric_sums`, :func:`row`, :func:`comparison`) are apart from
the stack (:func:`run_prefix`).
"""

from __future__ import annotations

import asyncio
import math
import random
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmq_bench import loadgen, pipeline
from llmq_bench.prompts import SESSION_GAP, CodePrompt

MODES = ("prefix", "least_loaded")
ENGINES = {"sim": "llmq-sim", "real": "smollm2-135m-instruct"}
PAID_KEY = "llmq-dev-key"
HIT, QUERY = "llmq_worker_prefix_cache_hit_tokens_total", "llmq_worker_prefix_cache_query_tokens_total"
DECISIONS = "llmq_batcher_prefix_route_decisions_total"
TTFT_P90_RATIO_GOAL = 0.5  # issue 31: prefix-aware TTFT p90 at most half of least-loaded's, shedding no more
# A worker's budget over its 1/N share of the headers: room for the tails its prompts cache too (each prompt's ~430
# bytes after its header), which would otherwise evict the header of a session it has seen only once.
BUDGET_HEADROOM = 1.2


@dataclass(frozen=True)
class PrefixBenchConfig:
    """The engine and its workers, the sessions, the offered load and the SLO."""

    engine: str = "sim"
    workers: int = 4
    headers: int = 30
    cursors: int = 10
    rate: float = 12.0
    classes: str = "interactive=0.8,near_interactive=0.2"
    seed: int = 7
    slo_ms: float = 2000.0
    timeout_s: float = 120.0
    prefill_ms_per_token: float = 0.1  # sim: per uncached prompt token (byte tokens)
    sim_batch_time_ms: int = 100
    sim_max_batch_size: int = 8
    output: Path = Path("bench/results/prefix-sim.json")

    @property
    def model(self) -> str:
        return ENGINES[self.engine]


# --- pure parts ----------------------------------------------------------------------------------------------------


def header_of(prompt: CodePrompt) -> str:
    return prompt.prompt.split(SESSION_GAP, 1)[0]


def budget_tokens(header_tokens: Sequence[int], workers: int) -> int:
    """A worker's prefix-cache budget: its 1/N share of the distinct headers' tokens, times BUDGET_HEADROOM."""
    return math.ceil(BUDGET_HEADROOM * sum(header_tokens) / workers)


def metric_sums(texts: Sequence[str], name: str, by: str | None = None) -> dict[str, float]:
    """The sum over Prometheus exposition ``texts`` of the samples named ``name``, per value of label ``by`` (key ""
    without one)."""
    sums: dict[str, float] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    key = sample.labels.get(by, "") if by else ""
                    sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def row(mode: str, report: Mapping, workers: Sequence[str], batchers: Sequence[str]) -> dict:
    """One mode's figures from its load report and the /metrics texts of its workers and batchers."""
    hit, query = metric_sums(workers, HIT).get("", 0.0), metric_sums(workers, QUERY).get("", 0.0)
    requests = report["requests"] or 1
    status = report["status"]
    return {
        "mode": mode,
        "hit_rate": round(hit / query, 4) if query else 0.0,
        "ttft_ms": report["ttft_ms"],
        "latency_ms": report["latency_ms"],
        "throughput_rps": round(report["throughput_rps"], 3),
        "goodput_rps": round(report["goodput_rps"], 3),
        "goodput_by_class": {c: g["good"] for c, g in report["classes"].items()},
        "requests_by_class": {c: g["requests"] for c, g in report["classes"].items()},
        "share_429": round(status.get("429", 0) / requests, 4),
        "share_503": round(status.get("503", 0) / requests, 4),
        "not_ok": {s: n for s, n in status.items() if s != loadgen.OK},
        "decisions": {k: int(v) for k, v in metric_sums(batchers, DECISIONS, "reason").items()},
    }


def comparison(rows: Sequence[Mapping]) -> dict:
    """Prefix-aware against least-loaded: TTFT p90 ratio (goal at most TTFT_P90_RATIO_GOAL) and shedding."""
    by_mode = {r["mode"]: r for r in rows}
    prefix, least = by_mode.get("prefix"), by_mode.get("least_loaded")
    if prefix is None or least is None or not least["ttft_ms"]["p90"]:
        return {}
    ratio = prefix["ttft_ms"]["p90"] / least["ttft_ms"]["p90"]
    shed_prefix = prefix["share_429"] + prefix["share_503"]
    shed_least = least["share_429"] + least["share_503"]
    return {
        "ttft_p90_ratio": round(ratio, 3),
        "hit_rate": {"prefix": prefix["hit_rate"], "least_loaded": least["hit_rate"]},
        "sheds_no_more": shed_prefix <= shed_least,
        "goal_met": ratio <= TTFT_P90_RATIO_GOAL and shed_prefix <= shed_least,
    }


# --- the stack -----------------------------------------------------------------------------------------------------


def run_prefix(
    config: PrefixBenchConfig,
    stack_for: Callable[[str, int], object],
    prompts: Sequence[CodePrompt],
    header_tokens: Sequence[int],
    base_urls: Sequence[str],
    log: Callable[[str], None] = print,
) -> dict:
    """Both routing modes, one after the other, each on the services of ``stack_for(mode, budget_tokens)`` (a
    DevStack; Kafka and Redis kept between them); writes and returns the result."""
    budget = budget_tokens(header_tokens, config.workers)
    arrivals = loadgen.poisson_arrivals(
        config.rate, count=len(prompts), duration_s=3600, rng=random.Random(config.seed)
    )
    rows, reports = [], {}
    for mode in MODES:
        stack = stack_for(mode, budget)
        log(f"{mode}: {config.workers} {config.model} workers, budget {budget} tokens each")
        try:
            stack.up(timeout_s=600, log=lambda *_: None)
            plans = loadgen.plan_requests(
                prompts,
                arrivals,
                classes=loadgen.parse_weights(config.classes),
                keys={PAID_KEY: 1},
                stream_share=1.0,
                base_urls=base_urls,
                rng=random.Random(config.seed),
            )
            samples = asyncio.run(loadgen.run_load(plans, model=config.model, timeout_s=config.timeout_s))
            report = loadgen.summarize(
                samples,
                window_s=loadgen.arrival_window_s(arrivals, len(prompts), 3600),
                slo_ms=config.slo_ms,
            )
            urls = stack.metrics_urls()
            texts = {name: _read(url) for name, url in urls.items() if name.startswith(("worker-", "batcher"))}
            workers = [t for n, t in texts.items() if n.startswith("worker-")]
            batchers = [t for n, t in texts.items() if n.startswith("batcher")]  # batcher, batcher-1, ...
            rows.append(row(mode, report, workers, batchers))
            reports[mode] = report
        finally:
            stack.down(services_only=True)
    out = {
        "config": {**asdict(config), "output": str(config.output), "model": config.model},
        "sessions": {
            "headers": config.headers,
            "cursors": config.cursors,
            "repeat_share": round(1 - 1 / config.cursors, 3),
            "header_tokens_total": sum(header_tokens),
            "budget_tokens_per_worker": budget,
            "working_set_ratio": round(sum(header_tokens) / budget, 2),
        },
        "rows": rows,
        "comparison": comparison(rows),
        "reports": reports,
    }
    pipeline.write_result(out, config.output)
    return out


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()

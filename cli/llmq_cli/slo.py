"""``llmq slo``: service levels per traffic class, read from the Prometheus ``/metrics`` of a running stack.

Interactive classes (interactive, near_interactive): requests, p95 time to first token and p95/p99 total latency as the
API pods measured them (``llmq_api_ttft_seconds``, ``llmq_api_request_latency_seconds``), and their 429s and 504s.
Deferred work (batch jobs and other deferred requests): completion-by-deadline ratio, the share of final outcomes that
succeeded (``llmq_results_total``; an expired request missed its deadline), those that errored for what the caller sent
(outcome ``client_error``: a bad line, an unknown model) left out. Histograms of every pod and model are added up, then
quantiles are estimated from the buckets the way PromQL's ``histogram_quantile`` does (linear within a bucket).

Each figure is checked against its target (:class:`~llmq_core.settings.SloSettings`, ``LLMQ_SLO_*``, or ``--target``):
exit 0 when every target with data is met, 1 when one is missed, 2 when no /metrics could be read.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import httpx
import pydantic
import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from llmq_cli.console import make_console
from llmq_cli.options import AsJson
from llmq_core.constants import DEFERRED, INTERACTIVE, NEAR_INTERACTIVE
from llmq_core.settings import Settings, SloSettings
from llmq_core.status import OutcomeLabel

INTERACTIVE_CLASSES = (INTERACTIVE, NEAR_INTERACTIVE)
TTFT = "llmq_api_ttft_seconds"
LATENCY = "llmq_api_request_latency_seconds"
RESPONSES = "llmq_api_responses_total"
RESULTS = "llmq_results_total"


class Samples:
    """Samples of several /metrics texts added up: (sample name, sorted label pairs) -> value."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.values: dict[tuple[str, tuple], float] = defaultdict(float)
        for text in texts:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    self.values[(sample.name, tuple(sorted(sample.labels.items())))] += sample.value

    def total(self, name: str, **match: str) -> float:
        """Sum of ``name``'s samples whose labels include ``match``."""
        return sum(v for (n, labels), v in self.values.items() if n == name and _matches(labels, match))

    def buckets(self, histogram: str, **match: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) of ``histogram``'s buckets over every series matching ``match``."""
        counts: dict[float, float] = defaultdict(float)
        for (name, labels), value in self.values.items():
            if name == f"{histogram}_bucket" and _matches(labels, match):
                counts[float(dict(labels)["le"])] += value
        return sorted(counts.items())


def _matches(labels: tuple, match: dict[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in match.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative ``buckets`` (upper bound, count), interpolated linearly within its
    bucket; None without observations. In the +Inf bucket it answers the highest finite bound (as PromQL does)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def report(samples: Samples) -> dict[str, dict]:
    """Per traffic class: interactive ones get requests, p95 TTFT, p95/p99 total latency (seconds), 429s and 504s;
    deferred gets finished requests, those that succeeded, and the completion-by-deadline ratio (None: no data)."""
    out = {}
    for cls in INTERACTIVE_CLASSES:
        latency = samples.buckets(LATENCY, traffic_class=cls)
        out[cls] = {
            "requests": samples.total(RESPONSES, traffic_class=cls),
            "ttft_p95_s": histogram_quantile(0.95, samples.buckets(TTFT, traffic_class=cls)),
            "latency_p95_s": histogram_quantile(0.95, latency),
            "latency_p99_s": histogram_quantile(0.99, latency),
            "status_429": samples.total(RESPONSES, traffic_class=cls, code="429"),
            "status_504": samples.total(RESPONSES, traffic_class=cls, code="504"),
        }
    client_errors = samples.total(RESULTS, traffic_class=DEFERRED, outcome=OutcomeLabel.CLIENT_ERROR)
    finished = samples.total(RESULTS, traffic_class=DEFERRED) - client_errors
    succeeded = samples.total(RESULTS, traffic_class=DEFERRED, outcome=OutcomeLabel.SUCCEEDED)
    out[DEFERRED] = {
        "finished": finished,
        "succeeded": succeeded,
        "client_errors": client_errors,
        "completed_by_deadline_ratio": succeeded / finished if finished else None,
    }
    return out


def verdicts(result: dict[str, dict], targets: SloSettings) -> list[dict]:
    """Each target that is set (non-zero), against ``result`` (:func:`report`): class, figure (the target's field),
    measured value and target in the target's unit (ms, or a ratio), and ``met`` (None: no data to judge by)."""
    out = []
    for field, target in targets.model_dump().items():
        if not target:
            continue
        cls, figure = _split(field)
        if figure.endswith("_ms"):
            seconds = result[cls][figure.removesuffix("_ms") + "_s"]
            value = None if seconds is None else seconds * 1000
            met = None if value is None else value <= target
        else:
            value = result[cls][figure]
            met = None if value is None else value >= target
        out.append({"class": cls, "figure": figure, "value": value, "target": target, "met": met})
    return out


def _split(field: str) -> tuple[str, str]:
    """``near_interactive_latency_p99_ms`` -> (``near_interactive``, ``latency_p99_ms``): the longest class prefix."""
    cls = max((c for c in (*INTERACTIVE_CLASSES, DEFERRED) if field.startswith(c + "_")), key=len)
    return cls, field.removeprefix(cls + "_")


def targets_of(overrides: list[str]) -> SloSettings:
    """The targets of the environment (``LLMQ_SLO_*``) with ``overrides`` (``NAME=VALUE``, NAME a field of
    :class:`SloSettings`) applied; BadParameter names a bad one."""
    changes = {}
    for override in overrides:
        name, sep, value = override.partition("=")
        if not sep or name not in SloSettings.model_fields:
            raise typer.BadParameter(
                f"{override!r}: expected NAME=VALUE, NAME one of {', '.join(SloSettings.model_fields)}",
                param_hint="--target",
            )
        changes[name] = value
    try:
        return Settings().replace(slo=changes).slo
    except pydantic.ValidationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--target") from None


def scrape(urls: Iterable[str], timeout_s: float = 5.0) -> tuple[list[str], list[str]]:
    """The /metrics texts of ``urls``; returns (texts, urls that did not answer)."""
    texts, failed = [], []
    with httpx.Client(timeout=timeout_s) as client:
        for url in urls:
            try:
                response = client.get(url)
                response.raise_for_status()
                texts.append(response.text)
            except httpx.HTTPError:
                failed.append(url)
    return texts, failed


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def slo(
    url: list[str] = typer.Option(
        None, "--url", help="A /metrics URL (repeat); default: every service of the dev stack."
    ),
    state_dir: Path = typer.Option(Path("var/dev"), help="The dev stack whose services to read (without --url)."),
    target: list[str] = typer.Option(
        None,
        "--target",
        help="NAME=VALUE (repeat): a target of LLMQ_SLO_<NAME> for this run, e.g. interactive_ttft_p95_ms=500 "
        "(0: none).",
    ),
    as_json: AsJson = False,
) -> None:
    """Per traffic class: p95 TTFT and p95/p99 total latency (interactive classes), completion by deadline (deferred),
    each against its target: exit 0 when every target with data is met, 1 when one is missed, 2 with nothing read."""
    from llmq_cli.devstack import DevStack, StackConfig

    targets = targets_of(target or [])
    urls = url or list(DevStack(StackConfig(state_dir=state_dir)).metrics_urls().values())
    if not urls:
        typer.echo(f"no /metrics to read: no stack in {state_dir} and no --url", err=True)
        raise typer.Exit(2)
    texts, failed = scrape(urls)
    for missing in failed:
        typer.echo(f"warning: no answer from {missing}", err=True)
    if not texts:
        typer.echo("no /metrics answered: nothing to judge", err=True)
        raise typer.Exit(2)
    result = report(Samples(texts))
    checks = verdicts(result, targets)
    if as_json:
        typer.echo(json.dumps({**result, "targets": checks}, indent=2))
    else:
        _print(result, checks, f"{len(texts)} of {len(urls)} /metrics read")
    if any(check["met"] is False for check in checks):
        raise typer.Exit(1)


def _print(result: dict[str, dict], checks: list[dict], read: str) -> None:
    console = make_console()
    table = Table(
        "class",
        "requests",
        "TTFT p95 ms",
        "total p95 ms",
        "total p99 ms",
        "429",
        "504",
        title=f"interactive classes ({read})",
    )
    for cls in INTERACTIVE_CLASSES:
        row = result[cls]
        table.add_row(
            cls,
            f"{row['requests']:.0f}",
            _ms(row["ttft_p95_s"]),
            _ms(row["latency_p95_s"]),
            _ms(row["latency_p99_s"]),
            f"{row['status_429']:.0f}",
            f"{row['status_504']:.0f}",
        )
    console.print(table)
    deferred = result[DEFERRED]
    ratio = deferred["completed_by_deadline_ratio"]
    table = Table(
        "class", "finished", "succeeded", "client errors (left out)", "completed by deadline", title="batch work"
    )
    table.add_row(
        DEFERRED,
        f"{deferred['finished']:.0f}",
        f"{deferred['succeeded']:.0f}",
        f"{deferred['client_errors']:.0f}",
        "-" if ratio is None else f"{ratio:.1%}",
    )
    console.print(table)
    table = Table("class", "figure", "measured", "target", "verdict", title="targets (LLMQ_SLO_*, --target)")
    for check in checks:
        table.add_row(
            check["class"],
            check["figure"],
            _figure(check["figure"], check["value"]),
            ("<= " if check["figure"].endswith("_ms") else ">= ") + _figure(check["figure"], check["target"]),
            {True: "met", False: "MISSED", None: "no data"}[check["met"]],
        )
    console.print(table)


def _figure(figure: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if figure.endswith("_ms") else f"{value:.1%}"

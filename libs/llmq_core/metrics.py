"""Prometheus metrics of the batcher, workers and result-router, and the small HTTP server that exposes them.

(The API pod serves its own ``/metrics``: ``llmq_api.metrics``.) Each metrics object owns a private CollectorRegistry, so
several services can live in one test process. Names follow Prometheus conventions: ``llmq_<what>_<unit>``, counters
end in ``_total`` (prometheus_client appends it), durations in ``_seconds``. Labels: ``traffic_class`` (interactive,
near_interactive, deferred; ``unknown`` from producers that predate it), ``priority_class`` (constants.PRIORITY_CLASSES),
``model``; the per-tenant token counters are the billing feed. Model and tenant label values pass through a
:class:`~llmq_core.labels.LabelSet`: names outside the catalogue and the configured tenants read ``other``.

Autoscaling signal: ``llmq_batcher_oldest_queued_age_seconds`` (docs/operations/observability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llmq_core import wire
from llmq_core.ids import DEFAULT_REGION
from llmq_core.labels import LabelSet
from llmq_core.status import outcome_label

log = logging.getLogger(__name__)

# Seconds, from one scheduler step to a deferred job's day: one set, so every latency histogram aggregates alike.
LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
    14400,
    86400,
)
TOKEN_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LAG_INTERVAL_S = 1.0
UNKNOWN = "unknown"
# label sets more than one metric has
CLASS_MODEL = ("traffic_class", "model")
CLASS_MODEL_OUTCOME = (*CLASS_MODEL, "outcome")
PRIORITY_MODEL = ("priority_class", "model")
TENANT_MODEL = ("tenant", "model")


class RegionRegistry(CollectorRegistry):
    """A registry whose every sample carries the label ``region``: added here, where metrics are collected, so no
    metric definition or call site names it (and none can forget it)."""

    def __init__(self, region: str) -> None:
        super().__init__()
        self.region = region

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**s.labels, "region": self.region}) for s in family.samples]
            yield labelled

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A sample's value; ``labels`` need not name the region (one registry, one region)."""
        return super().get_sample_value(name, {"region": self.region, **(labels or {})})


class _Metrics:
    """A private registry and its text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, region: str) -> None:
        self.registry = RegionRegistry(region)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    # One metric a call, in this registry: the subclasses' definitions read as a table.
    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float] = LATENCY_BUCKETS_S
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Callable[[], None] | None:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread. ``port`` 0: nothing (returns None).

    Returns a function that stops the server. Raises OSError when the port is taken.
    """
    if not port:
        return None
    server, thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)

    return stop


class ConsumerLag:
    """``llmq_kafka_consumer_lag``: records between a consumer's position and the partition's high watermark."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge(
            "llmq_kafka_consumer_lag",
            "Records not yet consumed, per assigned partition",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self._shown: set[tuple[str, str, str]] = set()

    async def update(self, consumer, group: str) -> None:
        """Read ``consumer``'s assigned partitions once (aiokafka: highwater - position); forgets revoked ones."""
        shown = set()
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is None:
                continue
            with contextlib.suppress(Exception):  # position unknown yet (fetching or rebalancing): next round
                async with asyncio.timeout(0.5):  # not wait_for: Python 3.11's can swallow the watch's own cancel
                    position = await consumer.position(tp)
                labels = (group, tp.topic, str(tp.partition))
                self.gauge.labels(*labels).set(max(0, highwater - position))
                shown.add(labels)
        for labels in self._shown - shown:
            with contextlib.suppress(KeyError):
                self.gauge.remove(*labels)
        self._shown = shown

    async def watch(self, consumer, group: str, interval_s: float = LAG_INTERVAL_S) -> None:
        """:meth:`update` every ``interval_s`` until cancelled."""
        while True:
            await self.update(consumer, group)
            await asyncio.sleep(interval_s)


def _class(traffic_class: str | None) -> str:
    return traffic_class or UNKNOWN


class _Children:
    """A metric's labelled children, cached: prometheus_client's ``labels()`` locks and validates on every call, which
    would cost more than the observation itself on the per-request paths."""

    __slots__ = ("metric", "cache")

    def __init__(self, metric) -> None:
        self.metric = metric
        self.cache: dict[tuple[str, ...], object] = {}

    def __call__(self, *labels: str):
        child = self.cache.get(labels)
        if child is None:
            child = self.cache[labels] = self.metric.labels(*labels)
        return child


# --- batcher -----------------------------------------------------------------------------------------------------------


class BatcherMetrics(_Metrics):
    """Queues (depth, oldest age: the autoscaling signal), batches (size, fill, flush reason), time to dispatch,
    requests consumed and answered by the batcher itself, consumer lag."""

    def __init__(self, labels: LabelSet = LabelSet()) -> None:
        super().__init__(labels.region)
        self.labels = labels
        self.requests = self.counter("llmq_batcher_requests", "Requests consumed from llmq.requests.*", CLASS_MODEL)
        self.answered = self.counter(
            "llmq_batcher_answered_requests",
            "Requests the batcher answered itself (expired, canceled, overloaded) instead of dispatching",
            CLASS_MODEL_OUTCOME,
        )
        self.queue_depth = self.gauge("llmq_batcher_queue_depth", "Requests queued in the batcher", PRIORITY_MODEL)
        self.oldest_age = self.gauge(
            "llmq_batcher_oldest_queued_age_seconds",
            "Age of the oldest queued request (0: empty queue); the autoscaling signal",
            PRIORITY_MODEL,
        )
        self.dispatch_wait = self.histogram(
            "llmq_batcher_queue_wait_seconds", "Accepted by the API (created_ms) to dispatched in a Batch", CLASS_MODEL
        )
        self.batch_size = self.histogram(
            "llmq_batcher_batch_size_requests",
            "Requests per dispatched Batch",
            ("model", "flush_reason"),
            BATCH_SIZE_BUCKETS,
        )
        self.batch_fill = self.histogram(
            "llmq_batcher_batch_fill_ratio", "Batch size / the model's largest batch", ("model",), FILL_BUCKETS
        )
        self.flushes = self.counter(
            "llmq_batcher_flushes", "Dispatched Batches by flush reason (size, wait, drain)", ("model", "reason")
        )
        self.ingress_refused = self.counter(
            "llmq_batcher_ingress_refused",
            "Ingress records refused: tenant_not_allowed or class_not_allowed (answered errored), reply_not_kafka "
            "(dead-lettered)",
            ("reason",),
        )
        self.saturation_report_failures = self.counter(
            "llmq_batcher_saturation_report_failures",
            "Saturation report (and stats) writes to Redis that failed; each is retried the next report interval",
        )
        self.capacity_claims = self.counter(
            "llmq_batcher_capacity_claims",
            "Batches claimed from their worker's capacity ledger: granted (all), short (part), refused (none: the"
            " worker's room or its window's turn), failed (Redis did not answer)",
            ("model", "outcome"),
        )
        self.capacity_requests = self.counter(
            "llmq_batcher_capacity_requests",
            "Requests of claimed batches: granted, or held back for a later round",
            ("model", "outcome"),
        )
        self.prefix_routes = self.counter(
            "llmq_batcher_prefix_route_decisions",
            "Batches for continuous-batching workers by why their worker was chosen: affinity (it holds most of the"
            " first request's prefix), load_override (the holder was loaded past LLMQ_BATCHER_PREFIX_AFFINITY_MAX_LOAD:"
            " the least-loaded instead), no_match (no worker holds a block of it: the least-loaded), off (prefix"
            " routing disabled)",
            ("model", "reason"),
        )
        self.preempting_dispatches = self.counter(
            "llmq_batcher_preempting_dispatches",
            "Batches dispatched into a continuous-batching worker's preemptible room (no worker had free slots: the"
            " worker preempts running deferred sequences to run their interactive or near-interactive requests)",
            ("model",),
        )
        self.redispatches = self.counter(
            "llmq_batcher_redispatches",
            "Requests dispatched again after their worker was lost, by outcome: continued (from the tokens earlier"
            " attempts generated, docs/workers.md#continuation) or from_start (nothing to continue, or past"
            " LLMQ_BATCHER_MAX_CONTINUATIONS, constrained or with logprobs)",
            ("model", "outcome"),
        )
        self.continued_tokens = self.counter(
            "llmq_batcher_continued_tokens",
            "Generated tokens re-dispatched requests carried to their next worker (not generated again)",
            ("model",),
        )
        self.prefix_index_blocks = self.gauge(
            "llmq_batcher_prefix_index_blocks",
            "Prefix-chain hashes the batcher's prefix index holds, every live worker's summary and its own dispatches",
        )
        self.prefix_summaries_ignored = self.counter(
            "llmq_batcher_prefix_summaries_ignored",
            "Worker prefix summaries not taken: block_bytes (another block size), unknown_worker (not live, or another"
            " model), out_of_order (older than the last taken)",
            ("reason",),
        )
        self._ignored_seen: dict[str, int] = {}
        self.lag = ConsumerLag(self.registry)
        self._queue_labels: set[tuple[str, str]] = set()
        self._requests, self._waits = _Children(self.requests), _Children(self.dispatch_wait)
        self._sizes, self._flushes, self._fills = (
            _Children(self.batch_size),
            _Children(self.flushes),
            _Children(self.batch_fill),
        )

    def consumed(self, request: wire.GenerationRequest) -> None:
        self._requests(request.traffic_class, self.labels.model(request.model)).inc()

    def dispatched(
        self,
        model: str,
        flush_reason: str,
        requests: list[wire.GenerationRequest],
        now_ms: int,
        max_batch: int | None,
        route: str | None = None,
        preempting: bool = False,
    ) -> None:
        """One Batch produced at ``now_ms`` (epoch ms); ``max_batch``: the model's largest batch (None: unknown);
        ``route``: why prefix routing chose its worker (None: not routed); ``preempting``: it went into its worker's
        preemptible room."""
        size, model = len(requests), self.labels.model(model)
        if route is not None:
            self.prefix_routes.labels(model, route).inc()
        if preempting:
            self.preempting_dispatches.labels(model).inc()
        self._sizes(model, flush_reason).observe(size)
        self._flushes(model, flush_reason).inc()
        if max_batch:
            self._fills(model).observe(min(1.0, size / max_batch))
        for request in requests:
            self._waits(request.traffic_class, model).observe(max(0, now_ms - request.created_ms) / 1000)

    def claimed(self, model: str, requests: int, granted: int | None) -> None:
        """One batch of ``requests`` claimed from the ledger; ``granted``: of them (None: the claim failed)."""
        model = self.labels.model(model)
        if granted is None:
            outcome = "failed"
        else:
            outcome = "granted" if granted >= requests else "short" if granted else "refused"
            self.capacity_requests.labels(model, "granted").inc(granted)
        self.capacity_claims.labels(model, outcome).inc()
        self.capacity_requests.labels(model, "held_back").inc(requests - (granted or 0))

    def redispatched(self, model: str, requests: Sequence[wire.GenerationRequest]) -> None:
        """Re-dispatched ``requests`` of one batch of ``model``, continued or not."""
        model = self.labels.model(model)
        continued = [r.continuation for r in requests if r.continuation is not None]
        if continued:
            self.redispatches.labels(model, "continued").inc(len(continued))
            self.continued_tokens.labels(model).inc(sum(len(ids) for c in continued for ids in c.token_ids))
        if len(continued) < len(requests):
            self.redispatches.labels(model, "from_start").inc(len(requests) - len(continued))

    def prefix_index(self, blocks: int, ignored: Mapping[str, int]) -> None:
        """The prefix index holds ``blocks`` hashes; ``ignored``: summaries it did not take since start, by reason."""
        self.prefix_index_blocks.set(blocks)
        for reason, count in ignored.items():
            seen = self._ignored_seen.get(reason, 0)
            if count > seen:
                self.prefix_summaries_ignored.labels(reason).inc(count - seen)
                self._ignored_seen[reason] = count

    def answered_request(self, request: wire.GenerationRequest, outcome: str) -> None:
        self.answered.labels(request.traffic_class, self.labels.model(request.model), outcome).inc()

    def queues(self, loads: Iterable[tuple[str, str, int, int]]) -> None:
        """Set the queue gauges from (priority_class, model, depth, oldest_age_ms); pairs not given read 0. Models
        outside the label set add up under ``other`` (depth summed, oldest age the largest)."""
        merged: dict[tuple[str, str], tuple[int, int]] = {}
        for priority_class, model, depth, oldest_age_ms in loads:
            key = (priority_class, self.labels.model(model))
            total, oldest = merged.get(key, (0, 0))
            merged[key] = (total + depth, max(oldest, oldest_age_ms if depth else 0))
        for (priority_class, model), (depth, oldest_age_ms) in merged.items():
            self.queue_depth.labels(priority_class, model).set(depth)
            self.oldest_age.labels(priority_class, model).set(oldest_age_ms / 1000)
        seen = set(merged)
        for labels in self._queue_labels - seen:
            self.queue_depth.labels(*labels).set(0)
            self.oldest_age.labels(*labels).set(0)
        self._queue_labels |= seen


# --- worker ------------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class GrammarStats:
    """What an engine's grammar cache did (structured outputs), read by :class:`WorkerMetrics` at each scrape: plain
    numbers, so the engine's threads count without a registry."""

    compiles: int = 0
    compile_seconds: float = 0.0
    max_compile_seconds: float = 0.0
    hits: int = 0
    tool_call_parse_failures: int = 0  # an answer to a tool constraint that did not parse as calls (should stay 0)

    def compiled(self, seconds: float) -> None:
        self.compiles += 1
        self.compile_seconds += seconds
        self.max_compile_seconds = max(self.max_compile_seconds, seconds)


@dataclass(slots=True)
class PreemptionStats:
    """What a continuous-batching engine's preemptions did (llmq_worker.preemption), read by :class:`WorkerMetrics`
    at each scrape: ``preemptions`` by the traffic class they made room for; ``resumes`` of preempted requests and the
    ``recomputed_tokens`` their resumes prefilled again (prompt + the ids generated before, per sequence; a prefix
    cache may hold part of them)."""

    preemptions: dict[str, int] = field(default_factory=dict)
    resumes: int = 0
    recomputed_tokens: int = 0

    def preempted(self, traffic_class: str) -> None:
        self.preemptions[traffic_class] = self.preemptions.get(traffic_class, 0) + 1

    def resumed(self, tokens: int) -> None:
        self.resumes += 1
        self.recomputed_tokens += tokens


class _PreemptionCollector(Collector):
    def __init__(self, model: str, stats: PreemptionStats) -> None:
        self._model, self._stats = model, stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        family = CounterMetricFamily(
            "llmq_worker_preemptions",
            "Deferred requests preempted, by the traffic class they made room for",
            labels=("model", "traffic_class"),
        )
        for traffic_class, count in sorted(stats.preemptions.items()):
            family.add_metric((self._model, traffic_class), count)
        yield family
        for name, doc, value in (
            ("llmq_worker_preemption_resumes", "Preempted requests resumed", stats.resumes),
            (
                "llmq_worker_preemption_recomputed_tokens",
                "Tokens resumes of preempted requests prefilled again (prompt + ids generated before, per sequence)",
                stats.recomputed_tokens,
            ),
        ):
            counter = CounterMetricFamily(name, doc, labels=("model",))
            counter.add_metric((self._model,), value)
            yield counter


class _GrammarCollector(Collector):
    def __init__(self, model: str, stats: GrammarStats) -> None:
        self._model, self._stats = model, stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        for name, doc, value in (
            ("llmq_worker_grammar_compiles", "Grammars compiled (cache misses) for structured outputs", stats.compiles),
            ("llmq_worker_grammar_compile_seconds", "Seconds spent compiling grammars", stats.compile_seconds),
            ("llmq_worker_grammar_cache_hits", "Constrained sequences that found their grammar compiled", stats.hits),
            (
                "llmq_worker_tool_call_parse_failures",
                "Answers to a tool constraint that did not parse as calls (0 unless the grammar failed)",
                stats.tool_call_parse_failures,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=("model",))
            family.add_metric((self._model,), value)
            yield family


class WorkerMetrics(_Metrics):
    """Slots (free, running, queued), utilisation, Batches taken, requests finished by outcome, tokens generated,
    prefix-cache hits (prompt tokens found cached of those looked up) and blocks held, consumer lag of the worker's
    partition."""

    def __init__(self, model: str, region: str = DEFAULT_REGION) -> None:
        super().__init__(region)
        self.model = model
        self.slots = self.gauge(
            "llmq_worker_slots", "Engine slots by state (free, running, queued)", ("model", "state")
        )
        self.max_slots = self.gauge("llmq_worker_max_slots", "Requests the engine runs at once", ("model",))
        self.utilization = self.gauge("llmq_worker_utilization_ratio", "Running / max slots", ("model",))
        self.batch_size = self.histogram(
            "llmq_worker_batch_size_requests", "Requests per Batch taken", ("model",), BATCH_SIZE_BUCKETS
        )
        self.requests = self.counter(
            "llmq_worker_requests", "Requests this worker finished, by outcome", CLASS_MODEL_OUTCOME
        )
        self.tokens = self.counter("llmq_worker_completion_tokens", "Completion tokens generated", ("model",))
        self.constrained = self.counter(
            "llmq_worker_constrained_requests",
            "Requests taken with constrained decoding, by kind (json_object, json_schema, tool)",
            ("model", "kind"),
        )
        self.prefix_hit_tokens = self.counter(
            "llmq_worker_prefix_cache_hit_tokens",
            "Prompt tokens of succeeded requests found in the prefix cache (not prefilled again)",
            ("model",),
        )
        self.prefix_query_tokens = self.counter(
            "llmq_worker_prefix_cache_query_tokens",
            "Prompt tokens of succeeded requests looked up in the prefix cache (hit rate: hit / query)",
            ("model",),
        )
        self.prefix_blocks = self.gauge(
            "llmq_worker_prefix_cache_blocks",
            "Prefix blocks (PREFIX_BLOCK_BYTES of prompt each) the worker accounts as cached",
            ("model",),
        )
        self.lag = ConsumerLag(self.registry)
        self._requests, self._tokens = _Children(self.requests), _Children(self.tokens)

    def watch_prefix_cache(self, ledger) -> None:
        """Expose the blocks a prefix ledger (anything with a length) holds; None: the engine caches none."""
        if ledger is not None:
            self.prefix_blocks.labels(self.model).set_function(lambda: len(ledger))

    def heartbeat(self, beat: wire.WorkerHeartbeat) -> None:
        """Capacity from the heartbeat the worker just built."""
        model = self.model
        self.slots.labels(model, "free").set(beat.free_slots)
        self.slots.labels(model, "running").set(beat.running)
        self.slots.labels(model, "queued").set(beat.queued)
        self.max_slots.labels(model).set(beat.max_slots)
        self.utilization.labels(model).set(beat.running / beat.max_slots if beat.max_slots else 0)

    def batch_taken(self, batch: wire.Batch) -> None:
        self.batch_size.labels(self.model).observe(len(batch.requests))
        for request in batch.requests:
            if request.structured is not None:
                self.constrained.labels(self.model, request.structured.kind).inc()

    def watch_grammars(self, stats: GrammarStats | None) -> None:
        """Expose an engine's grammar cache (None: its engine constrains nothing)."""
        if stats is not None:
            self.registry.register(_GrammarCollector(self.model, stats))

    def watch_preemptions(self, stats: PreemptionStats | None) -> None:
        """Expose an engine's preemptions (None: its engine never preempts)."""
        if stats is not None:
            self.registry.register(_PreemptionCollector(self.model, stats))

    def finished(self, result: wire.FinalResult) -> None:
        """Labelled with the worker's own model: a Batch produced straight to its partition may name any other."""
        self._requests(_class(result.traffic_class), self.model, result.outcome.value).inc()
        usage = result.usage
        if usage.completion_tokens:
            self._tokens(self.model).inc(usage.completion_tokens)
        if result.outcome is wire.Outcome.SUCCEEDED:  # ran on the engine: its prompt was looked up
            self.prefix_query_tokens.labels(self.model).inc(usage.prompt_tokens)
            self.prefix_hit_tokens.labels(self.model).inc(usage.cached_tokens)


# --- result-router -----------------------------------------------------------------------------------------------------


class RouterMetrics(_Metrics):
    """Every request's outcome and latencies (from its FinalResult on llmq.results), and per-tenant token usage.

    Counted once per request: only the first FinalResult stored for a request_id (``first=True`` in
    :meth:`result`), so redelivered results do not count twice.
    """

    def __init__(self, labels: LabelSet = LabelSet()) -> None:
        super().__init__(labels.region)
        self.labels = labels
        self.results = self.counter("llmq_results", "Requests by final outcome", CLASS_MODEL_OUTCOME)
        self.ttft = self.histogram(
            "llmq_request_time_to_first_token_seconds", "Accepted to first token (succeeded)", CLASS_MODEL
        )
        self.duration = self.histogram(
            "llmq_request_duration_seconds", "Accepted to final outcome (end-to-end)", CLASS_MODEL_OUTCOME
        )
        self.queue = self.histogram(
            "llmq_request_queue_seconds", "Accepted to engine start (or to the outcome if never)", CLASS_MODEL
        )
        self.itl = self.histogram(
            "llmq_request_inter_token_latency_seconds",
            "Mean time between a request's tokens after the first (succeeded, 2+ tokens)",
            CLASS_MODEL,
            TOKEN_LATENCY_BUCKETS_S,
        )
        self.prompt_tokens = self.counter(
            "llmq_tenant_prompt_tokens", "Prompt tokens of finished requests, per tenant", TENANT_MODEL
        )
        self.completion_tokens = self.counter(
            "llmq_tenant_completion_tokens", "Completion tokens of finished requests, per tenant", TENANT_MODEL
        )
        self.duplicates = self.counter("llmq_results_duplicates", "Redelivered results (not counted again)")
        self.reply_searches = self.counter(
            "llmq_reply_searches",
            "Kafka replies claimed but never marked delivered (a router killed or rebalanced mid-produce), searched for "
            "in their topic: found (not produced again) or not_found (produced)",
            ("outcome",),
        )
        self.stored_dropped = self.counter(
            "llmq_stored_results_dropped",
            "Stored results dropped (tenant_bound: its oldest, past the tenant's bound) or "
            "not stored (too_large: over the whole bound; refused: Redis refused the write)",
            ("reason",),
        )
        self.reply_dead_letters = self.counter(
            "llmq_reply_dead_letters",
            "Kafka replies dead-lettered (missing_topic, invalid_topic, refused: by the "
            "broker; retries: transient errors past the retry budget)",
            ("reason",),
        )
        self.log_lines_suppressed = self.counter(
            "llmq_router_log_lines_suppressed", "Dead-letter log lines left out (one per reply topic per window)"
        )
        self.forged_results = self.counter(
            "llmq_router_forged_results",
            "Batch-job line results dropped unstored: no such job, or another tenant's (a forgery on llmq.results)",
            ("reason",),
        )
        self.lag = ConsumerLag(self.registry)
        self._results, self._duration = _Children(self.results), _Children(self.duration)
        self._queue, self._ttft, self._itl = _Children(self.queue), _Children(self.ttft), _Children(self.itl)
        self._prompt, self._completion = _Children(self.prompt_tokens), _Children(self.completion_tokens)

    def result(self, result: wire.FinalResult, first: bool) -> None:
        """Count one FinalResult; ``first``: no result for its request_id was stored before."""
        if not first:
            self.duplicates.inc()
            return
        cls, timings = _class(result.traffic_class), result.timings
        outcome = outcome_label(result.outcome, result.error.type if result.error is not None else None).value
        model = self.labels.model(result.model)
        self._results(cls, model, outcome).inc()
        self._duration(cls, model, outcome).observe(timings.total_ms / 1000)
        self._queue(cls, model).observe(timings.queued_ms / 1000)
        usage = result.usage
        if usage.prompt_tokens or usage.completion_tokens:
            tenant = self.labels.tenant(result.tenant_id)
            self._prompt(tenant, model).inc(usage.prompt_tokens)
            self._completion(tenant, model).inc(usage.completion_tokens)
        if result.outcome is not wire.Outcome.SUCCEEDED or not timings.ttft_ms:
            return
        self._ttft(cls, model).observe(timings.ttft_ms / 1000)
        per_choice = usage.completion_tokens / max(1, len(result.choices))
        if per_choice >= 2:
            self._itl(cls, model).observe(max(0, timings.total_ms - timings.ttft_ms) / 1000 / (per_choice - 1))

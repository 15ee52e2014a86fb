"""Prometheus metrics of one API pod (its own registry, so several apps can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from llmq_api.admission import prediction_verdict
from llmq_core.labels import LabelSet
from llmq_core.metrics import CLASS_MODEL, _Metrics

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ApiMetrics(_Metrics):
    """Requests by endpoint/outcome/status, in-flight waiters, latencies, dropped replies, published and dropped cancels."""

    def __init__(self, in_flight: Callable[[], int], labels: LabelSet = LabelSet()) -> None:
        """``labels``: the model names the ``model`` label may carry (others, e.g. announced by a worker but not in
        the catalogue, read ``other``)."""
        super().__init__(labels.region)
        self.labels = labels
        self.requests = self.counter(
            "llmq_api_requests", "Finished HTTP generation requests", ("endpoint", "outcome", "status")
        )
        self.in_flight = self.gauge("llmq_api_in_flight", "Requests waiting for their result on this pod")
        self.in_flight.set_function(in_flight)
        self.latency = self.histogram(
            "llmq_api_request_duration_seconds", "Accept to last byte, by endpoint", ("endpoint",), _LATENCY_BUCKETS_S
        )
        self.ttft = self.histogram(
            "llmq_api_time_to_first_token_seconds", "Accept to first streamed text", ("endpoint",), _LATENCY_BUCKETS_S
        )
        self.dropped_replies = self.counter("llmq_api_dropped_replies", "Replies for unknown or finished requests")
        self.forged_replies = self.counter(
            "llmq_api_forged_replies",
            "Replies for a request this pod holds that name another tenant (forgeries, dropped)",
        )
        self.cancels = self.counter("llmq_api_cancels_published", "Cancels this pod published, by reason", ("reason",))
        self.cancels_dropped = self.counter(
            "llmq_api_cancels_dropped",
            "Cancels this pod gave up on (its queue full while Redis was unreachable, or unsent at shutdown), by reason",
            ("reason",),
        )
        self.admission_rejections = self.counter(
            "llmq_api_admission_rejections",
            "429s before any work: overload (queue_wait, queue_depth, pod_in_flight) "
            "or tenant limits (tenant_requests, tenant_tokens), by priority class",
            ("priority_class", "reason"),
        )
        self.admission_prediction_error = self.histogram(
            "llmq_api_admission_prediction_error_seconds",
            "|predicted - measured queue wait| of an admitted request (x-llmq-predicted-wait-ms against its result's "
            "timings.queued_ms), by priority class",
            ("priority_class",),
            _LATENCY_BUCKETS_S,
        )
        self.admission_predictions = self.counter(
            "llmq_api_admission_predictions",
            "Admitted requests by how their queue wait matched the prediction: within max(0.5 x measured, 250 ms), "
            "under (waited longer), over (shorter), by priority class",
            ("priority_class", "verdict"),
        )
        self.idempotent_replays = self.counter(
            "llmq_api_idempotent_replays", "Retries answered from an earlier request (stored result or joined)"
        )
        self.stream_resumes = self.counter(
            "llmq_api_stream_resumes",
            "Resumable streams taken by a request with their Idempotency-Key: outcome resumed (after a Last-Event-ID),"
            " replayed (whole), failed (the events after its Last-Event-ID were not kept)",
            ("outcome",),
        )
        # by traffic class and model (``unknown`` while not known yet): what the SLOs and autoscaling read
        self.responses = self.counter(
            "llmq_api_responses", "Generation responses by class, model and HTTP status", (*CLASS_MODEL, "code")
        )
        self.throttled = self.counter(
            "llmq_api_throttled", "429 answers (admission, tenant limits, full queues), by class", ("traffic_class",)
        )
        self.deadline_exceeded = self.counter(
            "llmq_api_deadline_exceeded", "504 answers (deadline passed), by class", CLASS_MODEL
        )
        self.class_latency = self.histogram(
            "llmq_api_request_latency_seconds",
            "Accept to last byte of an accepted request (what the client waited)",
            CLASS_MODEL,
        )
        self.class_ttft = self.histogram(
            "llmq_api_ttft_seconds",
            "Accept to first token: first streamed text, else the result's first token",
            CLASS_MODEL,
        )
        self._children: dict[tuple, object] = {}  # (metric, label values) -> its child: see child
        self.dependency_up = self.gauge(
            "llmq_api_dependency_up",
            "1 while a shared dependency (kafka, redis) is up for this pod, as /dependencies reports it",
            ("dependency",),
        )

    def track_dependencies(self, dependencies: list) -> None:
        """Read each :class:`llmq_api.health.Dependency`'s state into ``llmq_api_dependency_up`` at every scrape."""
        for dependency in dependencies:
            self.dependency_up.labels(dependency.name).set_function(lambda d=dependency: float(d.up))

    def child(self, metric, *values: str):
        """``metric.labels(*values)``, looked up once: prometheus_client validates and locks on every ``labels``
        call, which cost a request more than its counts (every label is of a bounded set, so is this cache)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def finished(self, endpoint: str, outcome: str, status: int, duration_s: float | None = None) -> None:
        """Count one finished request; ``duration_s`` for requests that were accepted (not for rejections)."""
        self.child(self.requests, endpoint, outcome, str(status)).inc()
        if duration_s is not None:
            self.child(self.latency, endpoint).observe(duration_s)

    def predicted(self, priority_class: str, predicted_ms: int, measured_ms: int) -> None:
        """An admitted request's queue wait (ms) against admission's prediction of it."""
        self.child(self.admission_prediction_error, priority_class).observe(abs(predicted_ms - measured_ms) / 1000)
        self.child(self.admission_predictions, priority_class, prediction_verdict(predicted_ms, measured_ms)).inc()

    def answered(
        self,
        traffic_class: str | None,
        model: str | None,
        status: int,
        duration_s: float | None = None,
        ttft_s: float | None = None,
    ) -> None:
        """One generation response by class and model: its status (429s and 504s also counted on their own) and, for
        accepted requests, the seconds the client waited and until its first token."""
        cls, model = traffic_class or "unknown", self.labels.model(model) if model else "unknown"
        self.child(self.responses, cls, model, str(status)).inc()
        if status == 429:
            self.child(self.throttled, cls).inc()
        elif status == 504:
            self.child(self.deadline_exceeded, cls, model).inc()
        if duration_s is not None:
            self.child(self.class_latency, cls, model).observe(duration_s)
        if ttft_s is not None:
            self.child(self.class_ttft, cls, model).observe(ttft_s)

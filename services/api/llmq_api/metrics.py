"""Prometheus metrics of one API pod (its own registry, so several apps can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ApiMetrics:
    """Requests by endpoint/outcome/status, in-flight waiters, latencies, dropped replies, published cancels."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("llmq_api_requests", "Finished HTTP generation requests",
                                ["endpoint", "outcome", "status"], registry=self.registry)
        self.in_flight = Gauge("llmq_api_in_flight", "Requests waiting for their result on this pod",
                               registry=self.registry)
        self.in_flight.set_function(in_flight)
        self.latency = Histogram("llmq_api_request_duration_seconds", "Accept to last byte, by endpoint",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.ttft = Histogram("llmq_api_time_to_first_token_seconds", "Accept to first streamed text",
                              ["endpoint"], buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.dropped_replies = Counter("llmq_api_dropped_replies", "Replies for unknown or finished requests",
                                       registry=self.registry)
        self.cancels = Counter("llmq_api_cancels_published", "Cancels this pod published, by reason", ["reason"],
                               registry=self.registry)
        self.admission_rejections = Counter(
            "llmq_api_admission_rejections", "429s before any work: overload (queue_wait, queue_depth, pod_in_flight) "
            "or tenant limits (tenant_requests, tenant_tokens), by priority class", ["priority_class", "reason"],
            registry=self.registry)
        self.idempotent_replays = Counter("llmq_api_idempotent_replays",
                                          "Retries answered from an earlier request (stored result or joined)",
                                          registry=self.registry)

    def finished(self, endpoint: str, outcome: str, status: int, duration_s: float | None = None) -> None:
        """Count one finished request; ``duration_s`` for requests that were accepted (not for rejections)."""
        self.requests.labels(endpoint, outcome, str(status)).inc()
        if duration_s is not None:
            self.latency.labels(endpoint).observe(duration_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

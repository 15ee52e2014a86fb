"""The worker's spans of a request (only while ``llmq_core.tracing`` is on), under the traceparent its Batch carried:
``worker.request`` (taken from the partition -> result produced) with ``worker.queue`` (-> engine start),
``worker.prefill`` (-> first token), ``worker.decode`` (-> finished) recorded from the result's timings, and
``worker.publish`` around the Redis reply and the llmq.results record, whose ``traceparent`` header it becomes."""

from __future__ import annotations

from opentelemetry import trace

from llmq_core import tracing, wire
from llmq_core.kafka import headers


class Publishing:
    """The open spans of results being delivered: :meth:`headers` for their records, :meth:`end` once acked."""

    def __init__(self) -> None:
        self.traceparents: dict[str, str | None] = {}
        self.spans: list[trace.Span] = []

    def headers(self, request_id: str) -> list[tuple[str, bytes]]:
        """Kafka headers of the llmq.results record of ``request_id``: content type and its traceparent."""
        return tracing.with_traceparent(headers(), self.traceparents.get(request_id))

    def end(self) -> None:
        for span in self.spans:
            span.end()


class RequestSpans:
    """What the spans need from the moment a request is taken: its traceparent, batch and time. Not thread-safe."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._taken: dict[str, tuple[str | None, str, int]] = {}  # request id -> (traceparent, batch id, taken ms)

    def taken(self, batch: wire.Batch, now_ms: int) -> None:
        for request in batch.requests:
            self._taken[request.request_id] = (request.traceparent, batch.batch_id, now_ms)

    def publishing(self, results: list[wire.FinalResult]) -> Publishing:
        """Record each result's engine phases and open its request and publish spans."""
        out = Publishing()
        for result in results:
            traceparent, batch_id, taken_ms = self._taken.pop(result.request_id, (None, "", result.created_ms))
            request = tracing.start_span(
                "worker.request",
                parent=traceparent,
                kind=tracing.SpanKind.CONSUMER,
                start_ms=taken_ms,
                attributes={
                    "llmq.request_id": result.request_id,
                    "llmq.batch_id": batch_id,
                    "llmq.worker_id": self.worker_id,
                    "llmq.model": result.model,
                    "llmq.outcome": result.outcome.value,
                    "llmq.batch_size": result.batch_size,
                    "llmq.completion_tokens": result.usage.completion_tokens,
                },
            )
            parent = trace.set_span_in_context(request)
            _phases(result, taken_ms, parent)
            publish = tracing.start_span(
                "worker.publish",
                parent=parent,
                kind=tracing.SpanKind.PRODUCER,
                attributes={"llmq.request_id": result.request_id},
            )
            out.traceparents[result.request_id] = tracing.traceparent_of(publish)
            out.spans += [publish, request]
        return out


def _phases(result: wire.FinalResult, taken_ms: int, parent) -> None:
    """queue -> prefill -> decode, from the result's timings (ms after created_ms); phases that did not happen are
    left out (a request answered without running has only its queue)."""
    timings, created = result.timings, result.created_ms
    finished = max(result.finished_ms or created + timings.total_ms, taken_ms)
    started = min(max(created + timings.queued_ms, taken_ms), finished)
    tracing.record_span("worker.queue", taken_ms, started, parent=parent)
    if not timings.ttft_ms:
        return
    first_token = min(max(created + timings.ttft_ms, started), finished)
    tracing.record_span("worker.prefill", started, first_token, parent=parent)
    tracing.record_span("worker.decode", first_token, finished, parent=parent)

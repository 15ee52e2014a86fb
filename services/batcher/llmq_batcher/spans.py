"""The batcher's spans of a request (only while ``llmq_core.tracing`` is on): ``batcher.queue`` from consumed to
dispatched or answered, then ``batcher.flush`` around producing its Batch. The request's ``traceparent`` in the Batch
is rewritten to its flush span, so the worker's spans nest under it."""

from __future__ import annotations

import msgspec
from opentelemetry import trace

from llmq_core import tracing, wire


class RequestSpans:
    """Open ``batcher.queue`` spans by request id. Not thread-safe; at most one per request held by the loop."""

    def __init__(self) -> None:
        self._queued: dict[str, trace.Span] = {}

    def consumed(self, request: wire.GenerationRequest, headers) -> None:
        """Open the request's queue span under the record's ``traceparent`` header (else the request's own field)."""
        if request.request_id in self._queued:
            return  # a redelivered twin of a request held here
        parent = tracing.header_traceparent(headers) or request.traceparent
        self._queued[request.request_id] = tracing.start_span(
            "batcher.queue",
            parent=parent,
            kind=tracing.SpanKind.CONSUMER,
            attributes=tracing.request_attributes(request),
        )

    def flush(self, batch: wire.Batch, partition: int) -> tuple[wire.Batch, list[trace.Span]]:
        """End the queue spans of ``batch``'s requests and open their flush spans; returns the Batch whose requests
        carry their flush span's traceparent, and the flush spans (end them once the Batch is produced)."""
        requests, spans = [], []
        attributes = {
            "llmq.batch_id": batch.batch_id,
            "llmq.worker_id": batch.worker_id,
            "llmq.partition": partition,
            "llmq.flush_reason": batch.flush_reason,
            "llmq.batch_size": len(batch.requests),
        }
        for request in batch.requests:
            queued = self._queued.pop(request.request_id, None)
            if queued is not None:
                queued.end()
                parent = trace.set_span_in_context(queued)
            else:  # re-sent after a failed produce: its queue span is over
                parent = tracing.parse(request.traceparent)
            span = tracing.start_span(
                "batcher.flush",
                parent=parent,
                kind=tracing.SpanKind.PRODUCER,
                attributes={"llmq.request_id": request.request_id, **attributes},
            )
            spans.append(span)
            requests.append(msgspec.structs.replace(request, traceparent=tracing.traceparent_of(span)))
        return msgspec.structs.replace(batch, requests=requests), spans

    def answered(self, request_id: str, outcome: str) -> str | None:
        """End the queue span of a request the batcher answered itself; returns its traceparent (for the result)."""
        span = self._queued.pop(request_id, None)
        if span is None:
            return None
        span.set_attribute("llmq.outcome", outcome)
        span.end()
        return tracing.traceparent_of(span)

    def dropped(self, request_id: str) -> None:
        """A queued request left without dispatch or answer (its result was already seen)."""
        span = self._queued.pop(request_id, None)
        if span is not None:
            span.end()

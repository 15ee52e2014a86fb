"""The FinalResult a fake worker answers: shared by the tests that stand in for workers."""

from __future__ import annotations

from llmq_core import constants, wire
from tests.fakes import Record


def fake_result(
    request: wire.GenerationRequest, outcome: wire.Outcome = wire.Outcome.SUCCEEDED, text: str = "", **fields
) -> wire.FinalResult:
    """``request``'s result: ``text`` as its one choice (none when errored), usage counting one token per character;
    ``fields``: the rest (error, finished_ms, worker_id, ...)."""
    choices = [] if outcome is wire.Outcome.ERRORED else [wire.Choice(index=0, text=text, finish_reason="length")]
    fields.setdefault("finished_ms", 0)
    return wire.FinalResult.for_request(
        request, outcome, choices=choices, usage=wire.Usage.of(request.prompt_tokens, len(text)), **fields
    )


def succeeded(request_id: str, reply_topic: str | None = None, text: str | None = None) -> wire.FinalResult:
    """``request_id``'s succeeded llmq-sim result, without choices (``text``: one choice of it, ended by length):
    answered on Kafka topic ``reply_topic``, or over HTTP to pod-1 when None."""
    reply_to = wire.HttpReply(instance_id="pod-1") if reply_topic is None else wire.KafkaReply(topic=reply_topic)
    choices = [] if text is None else [wire.Choice(index=0, text=text, finish_reason="length")]
    return wire.FinalResult(
        request_id=request_id, outcome=wire.Outcome.SUCCEEDED, model="llmq-sim", reply_to=reply_to, choices=choices
    )


def result_record(offset: int, result: wire.FinalResult, partition: int = 0) -> Record:
    """``result`` as the result-router consumes it: a record of llmq.results keyed by its request id."""
    return Record(
        offset=offset,
        value=wire.encode(result),
        key=result.request_id.encode(),
        topic=constants.TOPIC_RESULTS,
        partition=partition,
    )

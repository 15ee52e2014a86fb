"""The builders next to the wire types: a request's FinalResult, usage, the timings of a request that never ran."""

from __future__ import annotations

from llmq_core import wire
from llmq_jobs import jobs


def request() -> wire.GenerationRequest:
    return wire.GenerationRequest(
        request_id="r1",
        tenant_id="acme",
        traffic_class="near_interactive",
        tier="free",
        model="llmq-sim",
        endpoint="chat.completions",
        messages=[wire.ChatMessage(role="user", content="hi")],
        created_ms=1_000,
        deadline_ms=9_000,
        reply_to=wire.KafkaReply(topic="replies"),
    )


def test_a_result_repeats_every_field_it_shares_with_its_request():
    shared = set(wire.GenerationRequest.__struct_fields__) & set(wire.FinalResult.__struct_fields__)
    assert set(wire.RESULT_FIELDS_OF_REQUEST) == shared - {"schema_version"}
    req = request()
    usage = wire.Usage.of(3, 4)
    result = wire.FinalResult.for_request(req, wire.Outcome.SUCCEEDED, finished_ms=1_500, usage=usage, worker_id="w")
    assert {name: getattr(result, name) for name in shared} == {name: getattr(req, name) for name in shared}
    assert (result.outcome, result.finished_ms, result.usage, result.worker_id) == ("succeeded", 1_500, usage, "w")


def test_usage_totals_and_never_ran_timings():
    assert wire.Usage.of(12, 5) == wire.Usage(prompt_tokens=12, completion_tokens=5, total_tokens=17)
    assert wire.queued_timings(1_000, 1_250) == wire.Timings(queued_ms=250, ttft_ms=0, total_ms=250)
    assert wire.queued_timings(1_000, 900) == wire.Timings()  # a clock behind created_ms: never negative


def test_a_line_that_never_ran_answers_its_round_and_job_line():
    error = wire.ErrorInfo(type="batch_expired", message="late")
    result = jobs.unrun_line_result("batch_1", "c7", wire.Outcome.EXPIRED, error, finished_ms=5, round_=2)
    assert (result.request_id, result.reply_to) == ("batch_1:c7:2", wire.JobReply(batch_id="batch_1", custom_id="c7"))
    assert (result.outcome, result.error, result.finished_ms, result.model, result.usage) == (
        "expired",
        error,
        5,
        "",
        wire.Usage(),
    )

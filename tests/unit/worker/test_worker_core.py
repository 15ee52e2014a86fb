"""WorkerCore: the worker's I/O-free policy, with a scripted engine fake."""

from __future__ import annotations

import msgspec

from llmq_core.clock import FakeClock
from llmq_core.constants import replies_channel
from llmq_core.status import ErrorCode
from llmq_core.wire import FinalResult, KafkaReply, Outcome, Progress, StreamMark, TokenChunk
from llmq_worker.answers import STREAM_MARK_GRACE_MS
from llmq_worker.core import WorkerCore
from llmq_worker.engine import ChunkEvent
from tests.unit.worker.worker_fakes import T0_MS, StepEngine, batch, make_request, resumed

POD = replies_channel("pod-1")


def setup(**engine_args):
    clock = FakeClock(T0_MS + 100)
    engine = StepEngine(clock, **engine_args)
    core = WorkerCore(worker_id="w1", partition=3, model="llmq-sim", engine=engine, clock=clock)
    return clock, engine, core


def results_of(out) -> dict[str, FinalResult]:
    return {r.request_id: r for r in out.results}


def run_until_idle(core, engine, out=None):
    """Step the engine until the core has nothing pending; returns everything the core emitted."""
    out = out or core.on_events([])
    for _ in range(100):
        if not core.pending:
            return out
        out.extend(core.on_events(engine.step()))
    raise AssertionError("core never became idle")


def test_runs_a_batch_and_commits_after_delivery():
    clock, engine, core = setup()
    out = core.take_batch(batch(make_request("a", "hi"), make_request("b", "yo", stream=False)), offset=41)
    assert set(engine.submitted) == {"a", "b"} and not out
    out = core.on_events(engine.step())
    final = results_of(out)["a"]
    assert (final.outcome, final.choices[0].text, final.batch_size, final.worker_id) == (
        Outcome.SUCCEEDED,
        "hi",
        2,
        "w1",
    )
    assert (final.timings.queued_ms, final.timings.ttft_ms, final.timings.total_ms) == (100, 105, 110)
    assert [m for _, m in out.replies if isinstance(m, TokenChunk)] == [
        TokenChunk(request_id="a", index=0, text="hi", seq=0, sent_ms=clock.now_ms(), tenant_id="default", offset=0)
    ]  # the request's tenant: the pod takes chunks only for the tenant it holds the request for
    assert {ch for ch, _ in out.replies} == {POD}
    assert sorted(out.offsets) == [41, 41]
    assert core.release(out.offsets[:1]) is None
    assert core.release(out.offsets[1:]) == 42
    assert core.heartbeat(clock.now_ms(), 8192).last_batch_id == "b1"


def test_commit_waits_for_earlier_batches():
    _, engine, core = setup()
    core.take_batch(batch(make_request("a", "x"), batch_id="b1"), offset=5)
    first = core.on_events(engine.step())
    core.take_batch(batch(make_request("b", "y"), batch_id="b2"), offset=6)
    second = core.on_events(engine.step())
    assert core.release(second.offsets) is None
    assert core.release(first.offsets) == 7


def test_kafka_reply_requests_go_only_to_llmq_results():
    _, engine, core = setup()
    request = make_request("k", "hi")
    request = type(request)(
        **{**{f: getattr(request, f) for f in request.__struct_fields__}, "reply_to": KafkaReply(topic="t")}
    )
    core.take_batch(batch(request), offset=0)
    out = core.on_events(engine.step())
    assert out.replies == [] and set(results_of(out)) == {"k"}


def test_expired_canceled_and_invalid_requests_are_answered_without_running():
    clock, engine, core = setup()
    core.cancel("c", "client_disconnected")  # arrives before its batch
    out = core.take_batch(
        batch(
            make_request("late", deadline_ms=clock.now_ms()),
            make_request("c"),
            make_request("big", max_tokens=1000),
            make_request("other", model="llmq-tiny"),
            make_request("ok"),
        ),
        offset=0,
    )
    outcomes = {rid: (r.outcome, r.error.type if r.error else None) for rid, r in results_of(out).items()}
    assert outcomes == {
        "late": (Outcome.EXPIRED, None),
        "c": (Outcome.CANCELED, None),
        "big": (Outcome.ERRORED, "invalid_request_error"),
        "other": (Outcome.ERRORED, "model_mismatch"),
    }
    big = results_of(out)["big"].error  # the engine's param and code reach the client's error
    assert (big.message, big.param, big.code) == ("too long", "max_tokens", ErrorCode.CONTEXT_LENGTH_EXCEEDED)
    assert list(engine.submitted) == ["ok"]
    assert len(out.offsets) == 4 and core.release(out.offsets) is None


def test_cancel_of_a_running_request_aborts_it_and_deadline_expiry_says_expired():
    clock, engine, core = setup()
    core.take_batch(batch(make_request("a"), make_request("b", deadline_ms=T0_MS + 150)), offset=0)
    assert not core.cancel("a", "client_disconnected")
    clock.set(T0_MS + 150)
    assert not core.expire_overdue()
    assert engine.canceled == ["a", "b"]
    out = core.on_events(engine.stop("a") + engine.stop("b"))
    assert {rid: r.outcome for rid, r in results_of(out).items()} == {"a": Outcome.CANCELED, "b": Outcome.EXPIRED}


def test_duplicates_are_answered_once():
    _, engine, core = setup()
    core.take_batch(batch(make_request("a", "x"), batch_id="b1"), offset=0)
    core.take_batch(batch(make_request("a", "x"), batch_id="b2"), offset=1)  # redelivered while running
    out = core.on_events(engine.step())
    assert len(out.results) == 1 and sorted(out.offsets) == [0, 1]
    assert core.release(out.offsets) == 2
    again = core.take_batch(batch(make_request("a", "x"), batch_id="b3"), offset=2)  # after it finished
    assert again.results == [] and engine.submitted == {} and core.release(again.offsets) == 3
    retry = core.take_batch(batch(make_request("a", "x", attempt=1), batch_id="b4"), offset=3)  # a real retry runs
    assert not retry and list(engine.submitted) == ["a"]


def test_bisection_isolates_the_poisoned_request():
    _, engine, core = setup()
    requests = [make_request(f"r{i}", "POISON" if i == 5 else f"t{i}") for i in range(8)]
    out = run_until_idle(core, engine, core.take_batch(batch(*requests), offset=0))
    outcomes = {rid: r.outcome for rid, r in results_of(out).items()}
    assert outcomes == {f"r{i}": Outcome.ERRORED if i == 5 else Outcome.SUCCEEDED for i in range(8)}
    poisoned = results_of(out)["r5"]
    assert poisoned.error.retryable is False and poisoned.error.code == "poison"
    assert results_of(out)["r2"].choices[0].text == "t2"
    assert len(out.results) == 8 and core.release(out.offsets) == 1
    ids = [f"r{i}" for i in range(8)]
    assert engine.steps == [ids, ids[:4], ids[4:], ["r4", "r5"], ["r4"], ["r5"], ["r6", "r7"]]


def test_new_batches_wait_while_suspects_run_alone():
    _, engine, core = setup()
    core.take_batch(batch(make_request("bad", "POISON"), make_request("good", "ok")), offset=0)
    core.on_events(engine.step())  # shared failure: both are suspects now
    assert engine.submitted.keys() == {"bad"}
    core.take_batch(batch(make_request("new", "fresh"), batch_id="b2"), offset=1)
    assert engine.submitted.keys() == {"bad"}
    assert core.heartbeat(0, 100).queued == 2  # the suspect waiting for its turn and the new request
    out = run_until_idle(core, engine)
    assert {rid: r.outcome for rid, r in results_of(out).items()} == {
        "bad": Outcome.ERRORED,
        "good": Outcome.SUCCEEDED,
        "new": Outcome.SUCCEEDED,
    }


def test_chunks_carry_the_attempt_and_mark_what_reached_the_caller_until_after_the_deadline():
    clock, engine, core = setup()
    core.take_batch(batch(make_request("a", "hello", attempt=2, deadline_ms=T0_MS + 5_000)), offset=0)
    request = engine.submitted.pop("a")
    first = core.on_events([ChunkEvent("a", 0, "hé")])
    assert [(m.text, m.seq, m.attempt) for _, m in first.replies] == [("hé", 0, 2)]
    ttl_ms = T0_MS + 5_000 - clock.now_ms() + STREAM_MARK_GRACE_MS
    assert first.marks == [("a", StreamMark(attempt=2, completion_tokens=3), ttl_ms)]  # UTF-8 bytes: 3 tokens
    last = core.on_events([ChunkEvent("a", 0, "llo"), engine.final(request, Outcome.SUCCEEDED, "héllo")])
    assert [m.completion_tokens for _, m, _ in last.marks] == [6, 6]
    assert last.marks[-1][1].done and results_of(last)["a"].outcome is Outcome.SUCCEEDED


def test_requests_that_do_not_stream_leave_no_mark():
    _, engine, core = setup()
    core.take_batch(batch(make_request("n", "hi", stream=False)), offset=0)
    out = run_until_idle(core, engine)
    assert out.marks == [] and results_of(out)["n"].outcome is Outcome.SUCCEEDED


def test_a_stream_whose_text_was_sent_is_not_rerun_after_a_shared_failure():
    _, engine, core = setup()
    core.take_batch(batch(make_request("a", "hello"), make_request("quiet", "x")), offset=0)
    submitted, engine.submitted = engine.submitted, {}
    core.on_events([ChunkEvent("a", 0, "hel")])
    out = core.on_events([engine.final(r, Outcome.ERRORED, "", shared_failure=True) for r in submitted.values()])
    interrupted = results_of(out)["a"]
    assert (interrupted.outcome, interrupted.error.code, interrupted.error.retryable) == (
        Outcome.ERRORED,
        ErrorCode.STREAM_INTERRUPTED,
        True,
    )
    assert (interrupted.usage.completion_tokens, interrupted.choices) == (3, [])
    assert out.marks[-1][1] == StreamMark(attempt=0, completion_tokens=3, done=True)
    assert list(engine.submitted) == ["quiet"]  # nothing of it was sent: re-run alone, as before


def test_a_request_marked_mid_stream_is_answered_interrupted_and_not_run_again():
    _, engine, core = setup()
    streamed = msgspec.structs.replace(make_request("s", "hello", attempt=1), prompt_tokens=4)
    out = core.take_batch(
        batch(streamed, make_request("fresh"), make_request("n", stream=False)),
        offset=9,
        marks={"s": StreamMark(attempt=0, completion_tokens=7)},
    )
    result = results_of(out)["s"]
    assert (result.outcome, result.error.code, result.error.type) == (
        Outcome.ERRORED,
        ErrorCode.STREAM_INTERRUPTED,
        "server_error",
    )
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (4, 7, 11)
    assert [(ch, m) for ch, m in out.replies] == [(POD, result)]
    assert out.marks[0][1] == StreamMark(attempt=1, completion_tokens=7, done=True)
    assert set(engine.submitted) == {"fresh", "n"}
    assert out.offsets == [9]


def test_a_continued_stream_runs_again_and_restates_its_tokens_before_its_new_ones():
    clock, engine, core = setup()
    request = resumed(make_request("s", "hello", attempt=1, deadline_ms=T0_MS + 5_000), [104, 101])
    core.take_batch(batch(request), offset=3, marks={"s": StreamMark(attempt=0, completion_tokens=2)})
    assert engine.submitted["s"].continuation is not None  # it runs: the pod joins the two attempts' text
    ttl_ms = T0_MS + 5_000 - clock.now_ms() + STREAM_MARK_GRACE_MS
    replay = core.on_events([ChunkEvent("s", 0, "he")])  # the engine's replay of the continuation: no new ids
    assert [(m.text, m.seq, m.attempt, m.offset) for _, m in replay.replies] == [("he", 0, 1, 0)]
    assert replay.progress == [("s", Progress(attempt=1, index=0, start=0, token_ids=[104, 101]), ttl_ms)]
    more = core.on_events([ChunkEvent("s", 0, "ll", token_ids=(108, 108))])
    assert [(m.text, m.seq, m.offset) for _, m in more.replies] == [("ll", 1, 2)]
    assert [frame for _, frame, _ in more.progress] == [Progress(attempt=1, index=0, start=2, token_ids=[108, 108])]
    assert [ttl for _, _, ttl in more.progress] == [None]  # its key's expiry was set with its first frames
    done = core.on_events([engine.final(engine.submitted.pop("s"), Outcome.SUCCEEDED, "hell")])
    assert done.forget == ["s"] and results_of(done)["s"].outcome is Outcome.SUCCEEDED


def test_a_request_that_does_not_stream_writes_its_progress_when_flushed_and_forgets_it_at_its_result():
    _, engine, core = setup()
    core.take_batch(batch(make_request("n", "hi", stream=False)), offset=0)
    assert not core.flush_progress()  # nothing generated yet
    quiet = core.on_events([ChunkEvent("n", 0, "", token_ids=(104,))])  # ids whose text is held back
    assert not quiet.replies and not quiet.progress  # not a stream: its frames wait for the next flush
    assert [f for _, f, _ in core.flush_progress().progress] == [Progress(attempt=0, index=0, start=0, token_ids=[104])]
    assert not core.flush_progress()  # nothing new since
    out = core.on_events([engine.final(engine.submitted.pop("n"), Outcome.SUCCEEDED, "h")])
    assert out.forget == ["n"]


def test_a_result_with_no_progress_written_forgets_nothing():
    _, engine, core = setup()
    core.take_batch(batch(make_request("n", "hi", stream=False)), offset=0)
    out = run_until_idle(core, engine)
    assert out.forget == [] and results_of(out)["n"].outcome is Outcome.SUCCEEDED


def test_a_lost_attempts_record_read_again_is_skipped_when_a_later_attempt_streams_it():
    _, engine, core = setup()
    out = core.take_batch(batch(make_request("s", attempt=0)), offset=6, marks={"s": StreamMark(attempt=1)})
    assert not out.results and not engine.submitted and core.release(out.offsets) == 7


def test_a_request_whose_mark_is_done_is_a_duplicate():
    _, engine, core = setup()
    out = core.take_batch(batch(make_request("s")), offset=4, marks={"s": StreamMark(attempt=0, done=True)})
    assert not out.results and not engine.submitted and core.release(out.offsets) == 5


def test_abandon_all_answers_nothing_and_commits_nothing():
    _, engine, core = setup()
    core.take_batch(batch(make_request("a")), offset=0)
    core.abandon_all()
    out = core.on_events(engine.stop("a"))
    assert not out and core.pending == 0 and core.release([]) is None


def test_a_result_over_the_record_limit_is_one_errored_outcome_for_the_caller_and_the_log():
    clock = FakeClock(T0_MS + 100)
    engine = StepEngine(clock)
    core = WorkerCore(worker_id="w1", partition=3, model="llmq-sim", engine=engine, clock=clock, max_record_bytes=600)
    core.take_batch(batch(make_request("big", "x" * 700, stream=False), make_request("small", "ok")), offset=7)
    out = core.on_events(engine.step())
    big, small = results_of(out)["big"], results_of(out)["small"]
    assert (big.outcome, big.choices, big.error.code, big.error.retryable) == (
        Outcome.ERRORED,
        [],
        "result_too_large",
        False,
    )
    assert big.usage.total_tokens == 3 and "600" in big.error.message  # the work is still accounted
    assert [m for _, m in out.replies if isinstance(m, FinalResult) and m.request_id == "big"] == [big]
    assert small.outcome is Outcome.SUCCEEDED and small.choices[0].text == "ok"
    assert core.release(out.offsets) == 8


def test_a_stream_with_an_idempotency_key_logs_each_chunk_it_publishes_within_its_bound():
    clock = FakeClock(T0_MS + 100)
    engine = StepEngine(clock)
    core = WorkerCore(
        worker_id="w1", partition=3, model="llmq-sim", engine=engine, clock=clock, stream_log_max_bytes=300
    )
    keyed = msgspec.structs.replace(make_request("k", "hello"), idempotency_key="order-1")
    core.take_batch(batch(keyed, make_request("plain", "hello")), offset=0)
    first = core.on_events([ChunkEvent("k", 0, "he"), ChunkEvent("plain", 0, "he")])
    published = [m for _, m in first.replies if m.request_id == "k"]
    ttl_ms = keyed.deadline_ms - clock.now_ms() + STREAM_MARK_GRACE_MS
    assert [(i, msgspec.msgpack.decode(d, type=TokenChunk), t) for i, d, t in first.stream_log] == [
        ("k", published[0], ttl_ms)  # the very chunk published; a stream without a key logs nothing
    ]
    logged = [core.on_events([ChunkEvent("k", 0, "l" * 40)]).stream_log for _ in range(5)]
    sizes = [len(data) for entries in [first.stream_log, *logged] for _, data, _ in entries]
    assert sum(sizes) <= 300 < sum(sizes) + sizes[-1]  # past its bound: none more (a log has no gaps)
    assert [len(entries) for entries in logged] == [1] * (len(sizes) - 1) + [0] * (6 - len(sizes))
    assert [ttl for entries in logged for _, _, ttl in entries] == [None] * (len(sizes) - 1)  # set with the first

"""The simulated fixed-time batch engine, driven by a hand-moved clock (no real sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from llmq_core.clock import FakeClock
from llmq_core.constants import PREFIX_BLOCK_BYTES
from llmq_core.tokenizer import IncrementalDetokenizer, encode, render_chat
from llmq_core.wire import Batch, Outcome
from llmq_worker.core import WorkerCore
from llmq_worker.engine import ChunkEvent, FinalEvent, InvalidRequest
from llmq_worker.engines.simulated import SimulatedEngine, replay_tokens
from llmq_worker.prefix_cache import PrefixLedger
from tests.unit.worker.worker_fakes import T0_MS, make_request, resumed, settle


@pytest.fixture
async def engine(manual_time):
    engine = SimulatedEngine(max_batch_size=2, batch_time_ms=500, clock=manual_time.clock, sleep=manual_time.sleep)
    yield engine
    await engine.close()


async def collect(engine) -> list:
    """Every event ready now (without waiting)."""
    await settle()
    events = []
    while not engine._events._queue.empty():
        events += await engine.next_events()
    return events


def finals(events) -> dict[str, FinalEvent]:
    return {e.request_id: e for e in events if isinstance(e, FinalEvent)}


def streamed(events, request_id: str, index: int = 0) -> str:
    return "".join(
        e.text for e in events if isinstance(e, ChunkEvent) and e.request_id == request_id and e.index == index
    )


async def test_replays_prompt_cyclically_and_finishes_at_batch_end(engine, manual_time):
    engine.submit(make_request("r1", "abc", max_tokens=5))
    await manual_time.advance(499)
    events = await collect(engine)
    assert finals(events) == {}
    await manual_time.advance(1)
    events += await collect(engine)
    final = finals(events)["r1"]
    assert final.outcome is Outcome.SUCCEEDED
    assert [(c.text, c.finish_reason) for c in final.choices] == [("abcab", "length")]
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (3, 5, 8)
    assert (final.started_ms, final.finished_ms) == (T0_MS, T0_MS + 500)
    assert T0_MS < final.first_token_ms <= T0_MS + 500
    assert streamed(events, "r1") == "abcab"


async def test_a_batch_nobody_streams_emits_its_first_and_last_chunks_only(engine, manual_time):
    engine.submit(make_request("r1", "abcdefgh", max_tokens=8, stream=False))
    await manual_time.advance(500)
    events = await collect(engine)
    chunks = [e.text for e in events if isinstance(e, ChunkEvent)]
    final = finals(events)["r1"]
    assert chunks == ["a", "bcdefgh"] and final.choices[0].text == "abcdefgh"
    assert (final.first_token_ms, final.finished_ms) == (T0_MS + 500 // 8, T0_MS + 500)


async def test_chat_replays_last_user_message_and_counts_rendered_prompt(engine, manual_time):
    messages = [("system", "be brief"), ("user", "xy"), ("assistant", "ok"), ("user", "hi!")]
    engine.submit(make_request("c1", messages=messages, max_tokens=4))
    await manual_time.advance(500)
    final = finals(await collect(engine))["c1"]
    assert final.choices[0].text == "hi!h"
    assert final.usage.prompt_tokens == len(render_chat([tuple(m) for m in messages]).encode())


async def test_streams_spread_over_the_batch_time(engine, manual_time):
    engine.submit(make_request("r1", "abcdefgh", max_tokens=8))
    await manual_time.advance(250)
    half = await collect(engine)
    assert streamed(half, "r1") == "abcd"
    assert finals(half) == {}
    await manual_time.advance(250)
    assert streamed(await collect(engine), "r1") == "efgh"


async def test_batches_hold_at_most_max_batch_size(engine, manual_time):
    for rid in ("a", "b", "c"):
        engine.submit(make_request(rid))
    await settle()
    capacity = engine.capacity()
    assert (capacity.running, capacity.queued, capacity.free_slots, capacity.est_drain_ms) == (2, 1, 0, 1000)
    await manual_time.advance(500)
    assert set(finals(await collect(engine))) == {"a", "b"}
    await manual_time.advance(500)
    third = finals(await collect(engine))["c"]
    assert (third.started_ms, third.finished_ms) == (T0_MS + 500, T0_MS + 1000)


async def test_cancel_queued_request_never_starts(engine, manual_time):
    for rid in ("a", "b", "c"):
        engine.submit(make_request(rid))
    await settle()
    engine.cancel("c")
    final = finals(await collect(engine))["c"]
    assert (final.outcome, final.started_ms, final.usage.completion_tokens) == (Outcome.CANCELED, 0, 0)
    assert engine.capacity().queued == 0
    await manual_time.advance(1000)
    assert set(finals(await collect(engine))) == {"a", "b"}


async def test_cancel_running_request_ends_at_once_and_stops_emitting(engine, manual_time):
    engine.submit(make_request("a", "abcdefgh", max_tokens=8))
    engine.submit(make_request("b", "abcdefgh", max_tokens=8))
    await manual_time.advance(250)
    before = await collect(engine)
    engine.cancel("a")
    final = finals(await collect(engine))["a"]
    assert final.outcome is Outcome.CANCELED
    assert final.choices[0].text == streamed(before, "a") == "abcd"
    assert final.finished_ms == T0_MS + 250
    assert engine.capacity().running == 1
    await manual_time.advance(250)
    rest = await collect(engine)
    assert streamed(rest, "a") == "" and set(finals(rest)) == {"b"}


async def test_one_request_emits_a_choice_at_a_time_and_a_cancel_between_choices_stops_the_rest(engine, manual_time):
    """n=128 x 8,190 ids cost ~0.3 CPU s per request: other tasks (heartbeats, cancels) must run between its choices."""
    engine.submit(make_request("a", "abcdefgh", max_tokens=8, n=4, stream=False))
    seen: list[int] = []

    async def cancel_after_two_choices() -> None:
        while True:
            chunks = [e for e in engine._events._queue._queue if isinstance(e, ChunkEvent)]
            seen.append(len(chunks))
            if len(chunks) >= 2:
                engine.cancel("a")
                return
            await asyncio.sleep(0)

    watcher = asyncio.create_task(cancel_after_two_choices())
    await manual_time.advance(500)
    await watcher
    events = await collect(engine)
    assert 1 in seen  # the watcher ran between the first and second choice
    final = finals(events)["a"]
    assert final.outcome is Outcome.CANCELED
    assert {e.index for e in events if isinstance(e, ChunkEvent)} == {0, 1}


async def test_stop_string_spanning_chunks_is_never_emitted(engine, manual_time):
    engine.submit(make_request("s", "hello world", max_tokens=11, stop=["o w"]))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["s"]
    assert (final.choices[0].text, final.choices[0].finish_reason) == ("hell", "stop")
    assert final.choices[0].stop_sequence == "o w"  # Anthropic's stop_sequence: which stop ended it
    assert streamed(events, "s") == "hell"
    assert len([e for e in events if isinstance(e, ChunkEvent)]) > 1
    assert final.usage.completion_tokens == len("hello w")


@pytest.mark.parametrize("max_tokens", range(1, 14))
async def test_utf8_is_never_split(engine, manual_time, max_tokens):
    prompt = "é😀中"  # 2 + 4 + 3 bytes
    engine.submit(make_request("u", prompt, max_tokens=max_tokens))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["u"]
    text = final.choices[0].text
    assert "\ufffd" not in text
    assert streamed(events, "u") == text
    assert (prompt.encode() * 2)[:max_tokens].startswith(text.encode())
    assert final.usage.completion_tokens == max_tokens


async def test_n_choices_are_the_same_replay(engine, manual_time):
    engine.submit(make_request("n", "xyz", max_tokens=4, n=3))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["n"]
    assert [c.text for c in final.choices] == ["xyzx"] * 3
    assert [streamed(events, "n", i) for i in range(3)] == ["xyzx"] * 3
    assert final.usage.completion_tokens == 12


async def test_rejects_requests_over_the_context_window(manual_time):
    engine = SimulatedEngine(context_window=10, clock=manual_time.clock, sleep=manual_time.sleep)
    with pytest.raises(InvalidRequest):
        engine.submit(make_request("big", "abcdefgh", max_tokens=3))
    engine.submit(make_request("fits", "abcdefg", max_tokens=3))


@pytest.mark.parametrize(
    "request_args, match",
    [({"prompt": ""}, "empty"), ({"max_tokens": 0}, "at least 1"), ({"n": 0}, "at least 1")],
)
async def test_runs_the_shared_request_check_of_every_engine(engine, request_args, match):
    """Kafka-direct producers skip the API's checks: a request no engine can run is refused by this one too."""
    with pytest.raises(InvalidRequest, match=match):
        engine.submit(make_request("bad", **request_args))


async def test_poison_marker_fails_the_whole_batch(manual_time):
    engine = SimulatedEngine(max_batch_size=4, clock=manual_time.clock, sleep=manual_time.sleep, poison_marker="POISON")
    engine.submit(make_request("ok", "fine"))
    engine.submit(make_request("bad", "POISON"))
    await manual_time.advance(500)
    result = finals(await collect(engine))
    assert {rid: (f.outcome, f.shared_failure) for rid, f in result.items()} == {
        "ok": (Outcome.ERRORED, True),
        "bad": (Outcome.ERRORED, True),
    }
    await engine.close()


async def test_a_seed_reproduces_its_answer(engine, manual_time):
    for rid in ("a", "b"):
        engine.submit(make_request(rid, "seeded", max_tokens=9, temperature=1.0, seed=42))
    engine.submit(make_request("c", "seeded", max_tokens=9, temperature=1.0, seed=7))
    await manual_time.advance(1000)
    result = finals(await collect(engine))
    assert result["a"].choices == result["b"].choices == result["c"].choices
    assert result["a"].choices[0].text == "seededsee"


async def test_logit_bias_ids_are_checked_against_the_byte_vocabulary(engine, manual_time):
    engine.submit(make_request("ok", "abc", logit_bias={0: -100.0, 258: 5.0}))
    for bias in ({259: 1.0}, {-1: 1.0}, {3: 101.0}):
        with pytest.raises(InvalidRequest, match="logit_bias"):
            engine.submit(make_request("bad", "abc", logit_bias=bias))
    await manual_time.advance(500)
    assert finals(await collect(engine))["ok"].outcome is Outcome.SUCCEEDED


async def test_an_unknown_logit_bias_id_is_an_invalid_request_error_that_is_not_retried(engine):
    core = WorkerCore(worker_id="w", partition=0, model="llmq-sim", engine=engine, clock=FakeClock(T0_MS))
    batch = Batch(
        batch_id="b",
        worker_id="w",
        model="llmq-sim",
        formed_ms=T0_MS,
        flush_reason="size",
        requests=[make_request("bad", "abc", logit_bias={100_000: 1.0})],
    )
    (result,) = core.take_batch(batch, offset=0).results
    assert result.outcome is Outcome.ERRORED and result.error.type == "invalid_request_error"
    assert "logit_bias" in result.error.message and not result.error.retryable


PREFIXED = "h" * (4 * PREFIX_BLOCK_BYTES)  # four whole prefix blocks, as many byte tokens


@pytest.fixture
async def prefill_engine(manual_time):
    engine = SimulatedEngine(
        max_batch_size=2,
        batch_time_ms=500,
        clock=manual_time.clock,
        sleep=manual_time.sleep,
        prefill_ms_per_token=0.5,
        prefix_ledger=PrefixLedger(budget_tokens=100_000),
    )
    yield engine
    await engine.close()


async def test_a_batch_prefills_its_uncached_prompt_tokens_before_its_first_token(prefill_engine, manual_time):
    prompt = PREFIXED + "tail"  # 516 tokens, none cached: 258 ms of prefill, then the 500 ms batch
    prefill_engine.submit(make_request("cold", prompt, max_tokens=4, stream=False))
    await manual_time.advance(758)
    cold = finals(await collect(prefill_engine))["cold"]
    assert (cold.usage.prompt_tokens, cold.usage.cached_tokens) == (516, 0)
    assert cold.first_token_ms > T0_MS + 258 and cold.finished_ms == T0_MS + 758

    prefill_engine.submit(make_request("warm", PREFIXED + "others", max_tokens=4, stream=False))
    start_ms = manual_time.clock.now_ms()
    await manual_time.advance(503)  # 4 blocks cached: 6 uncached tokens, 3 ms of prefill
    warm = finals(await collect(prefill_engine))["warm"]
    assert (warm.usage.prompt_tokens, warm.usage.cached_tokens) == (518, 512)
    assert warm.finished_ms == start_ms + 503
    assert prefill_engine.fixed_batch_time_ms == 0  # its batch time varies: no fixed-time engine to the batchers


async def test_requests_of_one_batch_do_not_find_each_others_blocks(prefill_engine, manual_time):
    prefill_engine.submit(make_request("a", PREFIXED + "1", max_tokens=2, stream=False))
    prefill_engine.submit(make_request("b", PREFIXED + "2", max_tokens=2, stream=False))
    await manual_time.advance(1500)
    result = finals(await collect(prefill_engine))
    assert [result[r].usage.cached_tokens for r in "ab"] == [0, 0]
    assert result["a"].finished_ms == T0_MS + 500 + 513  # both prompts prefilled: 1,026 tokens at 0.5 ms


async def test_without_a_prefill_term_the_batch_time_is_fixed_and_hits_are_still_counted(manual_time):
    engine = SimulatedEngine(
        max_batch_size=2,
        batch_time_ms=500,
        clock=manual_time.clock,
        sleep=manual_time.sleep,
        prefix_ledger=PrefixLedger(budget_tokens=100_000),
    )
    for rid in ("first", "again"):
        engine.submit(make_request(rid, PREFIXED, max_tokens=2, stream=False))
        await manual_time.advance(500)
    result = finals(await collect(engine))
    assert result["first"].finished_ms == T0_MS + 500 and result["again"].finished_ms == T0_MS + 1000
    assert [result[r].usage.cached_tokens for r in ("first", "again")] == [0, len(PREFIXED)]
    await engine.close()


# --- continuations: a request resumed from the ids an earlier attempt generated ----------------------------------------


def chunks_of(events, request_id: str, index: int = 0) -> list[ChunkEvent]:
    return [e for e in events if isinstance(e, ChunkEvent) and e.request_id == request_id and e.index == index]


@pytest.mark.parametrize("prompt, max_tokens, k", [("hello world", 11, 4), ("é😀中", 9, 3), ("abc", 7, 5)])
async def test_a_continuation_replays_its_text_first_and_generates_only_the_rest(
    engine, manual_time, prompt, max_tokens, k
):
    whole = make_request("whole", prompt, max_tokens=max_tokens)
    replay = replay_tokens(whole)
    engine.submit(whole)
    engine.submit(resumed(make_request("cont", prompt, max_tokens=max_tokens), replay[:k]))
    first = chunks_of(await collect(engine), "cont")  # before the batch runs: the replay chunk only
    await manual_time.advance(500)
    events = await collect(engine)
    result = finals(events)
    expected_replay = decode_prefix(replay[:k])
    assert [(c.text, c.token_ids) for c in first] == [(expected_replay, ())]
    assert result["cont"].choices == result["whole"].choices
    assert result["cont"].usage == result["whole"].usage  # prompt: the original's; completion: max_tokens, once
    assert result["cont"].usage.completion_tokens == max_tokens
    later = chunks_of(events, "cont")
    assert [i for c in later for i in c.token_ids] == replay[k:]  # each id generated here, once, in order
    assert expected_replay + "".join(c.text for c in later) == result["whole"].choices[0].text


def decode_prefix(ids: list[int]) -> str:
    """The text ``ids`` release (a trailing incomplete character held back)."""
    return IncrementalDetokenizer().push(ids)


async def test_each_choice_resumes_from_its_own_ids_and_a_missing_one_from_the_start(engine, manual_time):
    engine.submit(resumed(make_request("n", "abcd", max_tokens=4, n=3), encode("ab"), []))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["n"]
    assert [c.text for c in final.choices] == ["abcd"] * 3 and final.usage.completion_tokens == 12
    assert [[i for c in chunks_of(events, "n", index) for i in c.token_ids] for index in range(3)] == [
        encode("cd"),
        encode("abcd"),
        encode("abcd"),
    ]


async def test_a_stop_string_across_the_seam_matches(engine, manual_time):
    engine.submit(resumed(make_request("s", "hello world", max_tokens=11, stop=["o w"]), encode("hello")))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["s"]
    assert (final.choices[0].text, final.choices[0].finish_reason, final.choices[0].stop_sequence) == (
        "hell",
        "stop",
        "o w",
    )
    assert final.usage.completion_tokens == len("hello w")
    assert chunks_of(events, "s")[0].text == "hell" and streamed(events, "s") == "hell"


@pytest.mark.parametrize("given", ["abcab", "abcabcabc"])  # max_tokens reached, or more ids than it (cut at it)
async def test_a_continuation_with_nothing_left_ends_at_once(engine, manual_time, given):
    engine.submit(resumed(make_request("done", "abc", max_tokens=5), encode(given)))
    events = await collect(engine)  # no time passes: no batch runs it
    final = finals(events)["done"]
    assert [(c.text, c.finish_reason) for c in final.choices] == [("abcab", "length")]
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, 5)
    assert final.started_ms == final.finished_ms == T0_MS and engine.capacity().queued == 0
    assert [(c.text, c.token_ids) for c in chunks_of(events, "done")] == [("abcab", ())]


async def test_a_continuation_of_a_request_asking_logprobs_is_ignored(engine, manual_time):
    engine.submit(resumed(make_request("lp", "abcd", max_tokens=4, logprobs=1), encode("ab")))
    await manual_time.advance(500)
    events = await collect(engine)
    final = finals(events)["lp"]
    assert final.choices[0].text == "abcd" and final.usage.completion_tokens == 4
    assert [i for c in chunks_of(events, "lp") for i in c.token_ids] == encode("abcd")
    assert len(final.choices[0].logprobs) == 4

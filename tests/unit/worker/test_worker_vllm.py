"""The vllm engine without vllm: its pure mappings, and its event handling over a scripted stand-in for ``generate``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest

from llmq_core.tokenizer import encode
from llmq_core.wire import Outcome, SamplingParams, Usage
from llmq_worker import logprobs
from llmq_worker.engine import ChunkEvent, InvalidRequest
from llmq_worker.engines.vllm_engine import (
    SEED_MODULUS,
    EngineDied,
    eos_ids,
    finish_reason,
    text_delta,
    vllm_continued_kwargs,
    vllm_entries,
    vllm_sampling_kwargs,
)
from tests.unit.worker.worker_fakes import ScriptedClient, drain, make_request, resumed, scripted_vllm, settle


def test_importing_the_worker_never_imports_vllm_or_torch():
    code = "import sys, llmq_worker.main, llmq_worker.engines.vllm_engine; print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_sampled_choices_get_temperature_top_p_stop_bias_and_their_own_seed():
    sampling = SamplingParams(
        max_tokens=7, temperature=0.7, top_p=0.9, stop=["\n", "END"], seed=41, n=3, logit_bias={5: -100, 9: 2.5}
    )
    kwargs = [vllm_sampling_kwargs(sampling, i) for i in range(3)]
    assert kwargs[0] == {
        "n": 1,
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["\n", "END"],
        "seed": 41,
        "logit_bias": {5: -100.0, 9: 2.5},
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
        "logprobs": None,
    }
    assert [k["seed"] for k in kwargs] == [41, 42, 43]
    assert vllm_sampling_kwargs(SamplingParams(logprobs=20), 0)["logprobs"] == 20
    assert kwargs[0]["stop"] is not sampling.stop


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.0, 0.5), (1.0, 0.0)])
def test_greedy_is_temperature_zero_without_seed(temperature, top_p):
    kwargs = vllm_sampling_kwargs(SamplingParams(temperature=temperature, top_p=top_p, seed=3, n=2), 1)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["seed"], kwargs["n"]) == (0.0, 1.0, None, 1)


def test_seeds_are_non_negative_int64_and_unseeded_stays_unseeded():
    assert vllm_sampling_kwargs(SamplingParams(seed=-1), 0)["seed"] == SEED_MODULUS - 1
    assert vllm_sampling_kwargs(SamplingParams(seed=2**63 - 1), 1)["seed"] == 0
    plain = vllm_sampling_kwargs(SamplingParams(), 0)
    assert plain["seed"] is None and plain["logit_bias"] is None and plain["stop"] == []


def test_text_delta_sends_the_new_part_and_never_a_replacement_character():
    cumulative = ["", "he", "hel", "hel\ufffd", "hel\ufffd", "helé", "helé 😀", "helé 😀!"]
    sent, pieces = 0, []
    for text in cumulative:
        piece = text_delta(text, sent)
        sent += len(piece)
        pieces.append(piece)
    assert pieces == ["", "he", "l", "", "", "é", " 😀", "!"]
    assert "".join(pieces) == "helé 😀!"
    assert text_delta("ok\ufffd", 2) == ""  # an incomplete last character is dropped at the end too


def test_finish_reason_mapping():
    assert [finish_reason(r) for r in ("stop", "length", "abort", "error", None)] == [
        "stop",
        "length",
        None,
        None,
        None,
    ]


# --- the engine over a scripted generate() ----------------------------------------------------------------------------


@pytest.fixture
async def client_engine():
    client = ScriptedClient()
    engine = scripted_vllm(client)
    yield client, engine
    await engine.close()


async def test_choices_stream_deltas_that_add_up_to_the_final_text(client_engine):
    client, engine = client_engine
    engine.submit(make_request("a", "héllo", max_tokens=4, n=2, temperature=1.0, seed=1))
    engine.submit(make_request("b", "hi", max_tokens=9))
    assert engine.capacity().max_slots == 2 and engine.capacity().running == 2 and engine.capacity().queued == 1
    finals, streamed = await drain(engine, 2)
    a, b = finals["a"], finals["b"]
    assert [(c.index, c.text, c.finish_reason) for c in a.choices] == [(0, "hél", "length"), (1, "hél", "length")]
    assert streamed[("a", 0)] == streamed[("a", 1)] == "hél"  # the split é was held back, never sent as U+FFFD
    assert a.usage == Usage(prompt_tokens=6, completion_tokens=8, total_tokens=14)
    assert (b.choices[0].text, b.choices[0].finish_reason, b.usage.completion_tokens) == ("hi", "stop", 2)
    assert a.outcome is b.outcome is Outcome.SUCCEEDED and 0 < a.started_ms <= a.first_token_ms <= a.finished_ms
    assert sorted(client.started) == ["a#0", "a#1", "b#0"]
    assert engine.capacity().running == 0


async def test_cancel_aborts_every_choice_and_ends_canceled_at_once(client_engine):
    client, engine = client_engine
    client.paused.clear()
    engine.submit(make_request("c", "abcdef", max_tokens=6, n=2, temperature=1.0))
    await settle()
    engine.cancel("c")
    (final,) = await engine.next_events()
    assert final.outcome is Outcome.CANCELED and [c.finish_reason for c in final.choices] == [None, None]
    await settle()
    assert sorted(client.aborted) == ["c#0", "c#1"]
    client.paused.set()
    engine.submit(make_request("d", "x", max_tokens=1))
    finals, _ = await drain(engine, 1)
    assert set(finals) == {"d"}  # nothing late from "c"


async def test_a_request_vllm_rejects_is_its_own_invalid_request_error(client_engine):
    client, engine = client_engine
    client.fail_with = ValueError("bad sampling")
    engine.submit(make_request("v", "abc", n=2, temperature=1.0))
    finals, _ = await drain(engine, 1)
    final = finals["v"]
    assert final.outcome is Outcome.ERRORED and not final.shared_failure
    assert (final.error.type, final.error.retryable) == ("invalid_request_error", False)


async def test_other_failures_are_shared_and_a_dead_engine_ends_the_event_stream(client_engine):
    client, engine = client_engine
    client.fail_with = RuntimeError("step failed")
    engine.submit(make_request("s", "abc"))
    finals, _ = await drain(engine, 1)
    assert finals["s"].shared_failure and finals["s"].error.retryable
    client.errored = True
    engine.submit(make_request("t", "abc"))
    with pytest.raises(EngineDied):
        await drain(engine, 1)


async def test_submit_rejects_what_can_never_run(client_engine):
    _, engine = client_engine
    with pytest.raises(InvalidRequest, match="logit_bias"):
        engine.submit(make_request("bias", "abc", logit_bias={259: 1.0}))
    with pytest.raises(InvalidRequest, match="context window"):
        engine.submit(make_request("long", "x" * 60, max_tokens=5))
    rejecting = scripted_vllm(ScriptedClient(), make_params=reject)
    with pytest.raises(InvalidRequest, match="top_p"):
        rejecting.submit(make_request("p", "abc"))
    assert engine.capacity().running == 0


def reject(**kwargs):
    raise ValueError("top_p must be in (0, 1]")


def test_vllm_logprobs_become_entries_with_the_top_alternatives_most_likely_first():
    candidates = {
        3 + ord("a"): SimpleNamespace(logprob=-2.0),  # chosen, not among the top 1
        3 + ord("b"): SimpleNamespace(logprob=-0.5),
        3 + ord("c"): SimpleNamespace(logprob=-1.0),
    }
    (entry,) = vllm_entries([3 + ord("a")], [candidates], 2, logprobs.byte_token_bytes)
    assert (entry.token, entry.logprob, entry.bytes) == ("a", -2.0, [97])
    assert [(t.token, t.logprob) for t in entry.top_logprobs] == [("b", -0.5), ("c", -1.0)]
    (alone,) = vllm_entries([3 + ord("a")], [candidates], 0, logprobs.byte_token_bytes)
    assert alone.top_logprobs == []


async def test_streamed_logprob_entries_add_up_to_the_final_ones_and_cover_a_split_character(client_engine):
    _, engine = client_engine
    engine.submit(make_request("lp", "héllo", max_tokens=4, logprobs=2))
    engine.submit(make_request("plain", "hi", max_tokens=2))
    finals, streamed = {}, {}
    async with asyncio.timeout(5):
        while len(finals) < 2:
            for event in await engine.next_events():
                if isinstance(event, ChunkEvent):
                    streamed.setdefault(event.request_id, []).append(event.logprobs)
                else:
                    finals[event.request_id] = event
    (choice,) = finals["lp"].choices
    assert choice.text == "hél"
    assert [e.token for e in choice.logprobs] == ["h", "\\xc3", "\\xa9", "l"]  # é's two bytes, each its own token
    assert b"".join(bytes(e.bytes) for e in choice.logprobs).decode() == "hél"
    assert [(t.token, t.logprob) for t in choice.logprobs[3].top_logprobs] == [("l", -0.13), ("m", -3.0)]
    assert [e for chunk in streamed["lp"] for e in chunk] == choice.logprobs
    assert finals["plain"].choices[0].logprobs is None and streamed["plain"] == [None, None]


def test_a_constraint_maps_to_vllms_own_structured_outputs():
    import types

    from llmq_core.wire import Structured
    from llmq_worker.engines.vllm_engine import structured_params, vllm_structured

    assert vllm_structured(None) == {}
    assert vllm_structured(Structured(kind="json_object")) == {"json_object": True}
    assert vllm_structured(Structured(kind="json_schema", schema='{"enum":[1]}')) == {"json": {"enum": [1]}}
    assert vllm_structured(Structured(kind="tool", schema='{"type":"array"}')) == {"json": {"type": "array"}}
    newer = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=dict))
    older = types.SimpleNamespace(sampling_params=types.SimpleNamespace(GuidedDecodingParams=dict))
    assert structured_params(newer)(json_object=True) == {"structured_outputs": {"json_object": True}}
    assert structured_params(older)(json={"a": 1}) == {"guided_decoding": {"json": {"a": 1}}}
    assert structured_params(newer)() == {}


# --- token ids and continuations -----------------------------------------------------------------------------------


async def events_of(engine, count: int) -> tuple[list[ChunkEvent], dict]:
    chunks, finals = [], {}
    async with asyncio.timeout(5):
        while len(finals) < count:
            for event in await engine.next_events():
                if isinstance(event, ChunkEvent):
                    chunks.append(event)
                else:
                    finals[event.request_id] = event
    return chunks, finals


def ids_of(chunks: list[ChunkEvent], request_id: str, index: int = 0) -> list[int]:
    return [i for c in chunks if (c.request_id, c.index) == (request_id, index) for i in c.token_ids]


async def test_every_generated_id_is_reported_once_also_while_its_text_is_held_back(client_engine):
    _, engine = client_engine
    engine.submit(make_request("a", "héllo", max_tokens=4))
    chunks, finals = await events_of(engine, 1)
    assert ids_of(chunks, "a") == encode("héllo")[:4]
    assert [(c.text, len(c.token_ids)) for c in chunks] == [("h", 1), ("", 1), ("é", 1), ("l", 1)]
    assert finals["a"].usage.completion_tokens == 4


def test_a_continued_choice_asks_vllm_for_the_rest_without_stop_strings():
    sampling = SamplingParams(max_tokens=7, stop=["x"], temperature=0.5, seed=3)
    assert vllm_continued_kwargs(sampling, 1, 3) == vllm_sampling_kwargs(sampling, 1) | {"max_tokens": 4, "stop": []}
    assert eos_ids(2, [2, 5], None, (7,)) == frozenset({2, 5, 7})


async def test_a_continuation_prompts_with_its_ids_and_generates_only_the_rest():
    client, params = ScriptedClient(), []
    engine = scripted_vllm(client, make_params=lambda **kwargs: params.append(kwargs) or kwargs)
    # The scripted vLLM echoes its prompt: prompt + continuation is "abcdefab", of which it generates the rest (4).
    engine.submit(resumed(make_request("c", "abcdef", max_tokens=6, stop=["zz"]), encode("ab")))
    chunks, finals = await events_of(engine, 1)
    final = finals["c"]
    assert (chunks[0].text, chunks[0].token_ids) == ("ab", ())
    assert ids_of(chunks, "c") == encode("abcd")
    assert [(c.text, c.finish_reason) for c in final.choices] == [("ababcd", "length")]
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (6, 6)
    assert [(p["max_tokens"], p["stop"]) for p in params] == [(4, [])]
    await engine.close()


async def test_a_stop_string_across_the_seam_ends_the_choice_and_aborts_its_vllm_request(client_engine):
    client, engine = client_engine
    # prompt + continuation "xyzab": after "ab" the first new id ("x") completes the stop "bx"
    engine.submit(resumed(make_request("s", "xyz", max_tokens=6, stop=["bx"], n=2), encode("ab"), encode("a")))
    chunks, finals = await events_of(engine, 1)
    final = finals["s"]
    assert [(c.text, c.finish_reason, c.stop_sequence) for c in final.choices] == [
        ("a", "stop", "bx"),
        ("axyza", "stop", None),  # the whole echo of its prompt + "a" fits its 5 tokens left: a natural end
    ]
    assert final.usage.completion_tokens == 3 + 5
    assert ids_of(chunks, "s", 0) == encode("x") and ids_of(chunks, "s", 1) == encode("xyza")
    assert "".join(c.text for c in chunks if c.index == 0) == "a"  # the held "b" was never sent
    await settle()
    assert client.aborted == ["s#0"]


async def test_a_continuation_with_nothing_left_ends_at_once_without_vllm(client_engine):
    client, engine = client_engine
    engine.submit(resumed(make_request("d", "abc", max_tokens=4, n=2), encode("abca"), encode("ab\n")))
    engine.submit(resumed(make_request("stop", "abc", max_tokens=4, stop=["\n"]), encode("ab\n")))
    chunks, finals = await events_of(engine, 2)
    assert [(c.text, c.finish_reason) for c in finals["stop"].choices] == [("ab", "stop")]
    assert finals["stop"].usage.completion_tokens == 3
    assert client.started == ["d#1"]  # only the choice with tokens left runs
    assert [(c.text, c.finish_reason) for c in finals["d"].choices] == [("abca", "length"), ("ab\na", "length")]
    assert finals["d"].usage.completion_tokens == 8

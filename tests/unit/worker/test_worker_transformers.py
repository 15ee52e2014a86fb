"""llmq-tiny and the transformers engine (ContinuousBatchingManager) on CPU: small, fast requests only."""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llmq_core import tokenizer as byte_tokenizer  # noqa: E402
from llmq_core.constants import PREFIX_BLOCK_BYTES  # noqa: E402
from llmq_core.wire import (  # noqa: E402
    ChatMessage,
    Continuation,
    GenerationRequest,
    HttpReply,
    Outcome,
    SamplingParams,
)
from llmq_worker.engine import ChunkEvent, FinalEvent, InvalidRequest  # noqa: E402
from llmq_worker.engines import cb_scheduler  # noqa: E402
from llmq_worker.engines.tiny_model import build_llmq_tiny, tiny_tokenizer  # noqa: E402
from llmq_worker.engines.transformers_engine import TransformersEngine  # noqa: E402
from llmq_worker.prefix_cache import PrefixLedger  # noqa: E402

TEXTS = ["", "hello", "héllo wörld", "日本語のテキスト", "emoji 😀👍🏽 mix\n\t", "\x00\x7f ascii edge"]


def request(request_id: str, prompt: str | None = "hello", *, messages=None, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(
        request_id=request_id,
        model="llmq-tiny",
        endpoint="chat.completions" if messages else "completions",
        prompt=None if messages else prompt,
        messages=[ChatMessage(role=r, content=c) for r, c in messages] if messages else None,
        sampling=SamplingParams(**sampling),
        created_ms=0,
        deadline_ms=1 << 60,
        reply_to=HttpReply(instance_id="pod"),
    )


@pytest.fixture(scope="module")
def tiny():
    return build_llmq_tiny()


@pytest.fixture(scope="module")
async def engine(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=8, context_window=8192)
    yield engine
    await engine.close()


async def run(engine, *requests, timeout_s: float = 60) -> tuple[dict[str, FinalEvent], dict[tuple[str, int], str]]:
    """Submit ``requests`` and wait for all their FinalEvents; returns them and the streamed text per choice."""
    for r in requests:
        engine.submit(r)
    finals, streamed = {}, {}
    async with asyncio.timeout(timeout_s):
        while len(finals) < len(requests):
            for event in await engine.next_events():
                if isinstance(event, FinalEvent):
                    finals[event.request_id] = event
                else:
                    key = (event.request_id, event.index)
                    streamed[key] = streamed.get(key, "") + event.text
    return finals, streamed


def greedy_ids(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def decode(ids: list[int]) -> str:
    detokenizer = byte_tokenizer.IncrementalDetokenizer()
    return detokenizer.push(ids) + detokenizer.finish()


@pytest.mark.parametrize("text", TEXTS)
def test_byt5_tokenizer_ids_match_llmq_core(text):
    tokenizer = tiny_tokenizer()
    assert tokenizer(text, add_special_tokens=False).input_ids == byte_tokenizer.encode(text)
    assert len(tokenizer) == byte_tokenizer.VOCAB_SIZE
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)


def test_chat_template_renders_like_render_chat():
    messages = [("system", "be brief"), ("user", "héllo 😀"), ("assistant", "hi"), ("user", "again")]
    rendered = tiny_tokenizer().apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], add_generation_prompt=True, tokenize=False
    )
    assert rendered == byte_tokenizer.render_chat(messages)


def test_tiny_model_is_the_same_on_every_build(tiny):
    model, _ = tiny
    again, _ = build_llmq_tiny()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert model.config.max_position_embeddings >= 8192 and model.config.vocab_size == 259


async def test_greedy_answer_is_generate_output_well_formed_with_usage(engine, tiny):
    model, _ = tiny
    prompt = "The quick brown fox 🦊"
    finals, streamed = await run(engine, request("g", prompt, max_tokens=24))
    final = finals["g"]
    text = final.choices[0].text
    assert final.outcome is Outcome.SUCCEEDED and final.choices[0].finish_reason == "length"
    assert text == decode(greedy_ids(model, byte_tokenizer.encode(prompt), 24))
    assert "\ufffd" not in text and streamed[("g", 0)] == text
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (len(prompt.encode()), 24)
    assert final.usage.total_tokens == final.usage.prompt_tokens + 24
    assert 0 < final.started_ms <= final.first_token_ms <= final.finished_ms


async def test_n_choices_and_chat_prompt_accounting(engine):
    messages = [("system", "sys"), ("user", "héllo")]
    finals, streamed = await run(engine, request("n", messages=messages, max_tokens=10, n=3))
    final = finals["n"]
    assert [c.index for c in final.choices] == [0, 1, 2]
    assert len({c.text for c in final.choices}) == 1  # greedy: the same text thrice
    assert [streamed.get(("n", i), "") for i in range(3)] == [c.text for c in final.choices]
    assert final.usage.prompt_tokens == len(byte_tokenizer.render_chat(messages).encode())
    assert final.usage.completion_tokens == 30


async def test_sampled_requests_are_well_formed(engine):
    finals, streamed = await run(engine, *(request(f"s{i}", "abc", max_tokens=40, temperature=1.0) for i in range(4)))
    for rid, final in finals.items():
        text = final.choices[0].text
        assert "\ufffd" not in text and streamed.get((rid, 0), "") == text
        assert 1 <= final.usage.completion_tokens <= 40
        # Under 40 tokens only an EOS ends a choice; at 40 the last draw may have been the EOS (a natural end, "stop").
        if final.usage.completion_tokens < 40:
            assert final.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("max_tokens", [1, 40])
async def test_eos_as_the_last_allowed_token_is_a_natural_end(engine, max_tokens):
    """A bias forces the EOS (id 1) first: it is counted, nothing visible follows, and it is a natural end ("stop")
    even when it is also the last token max_tokens allows."""
    finals, streamed = await run(engine, request("eos", "abc", max_tokens=max_tokens, logit_bias={1: 100.0}))
    final = finals["eos"]
    assert (final.choices[0].text, final.usage.completion_tokens) == ("", 1)
    assert final.choices[0].finish_reason == "stop" and streamed.get(("eos", 0), "") == ""


async def test_stop_string_ends_the_choice_before_it(engine):
    base, _ = await run(engine, request("base", "stop here", max_tokens=40))
    text = base["base"].choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = text[: text.index(stop)]
    finals, streamed = await run(engine, request("st", "stop here", max_tokens=40, stop=[stop]))
    final = finals["st"]
    assert (final.choices[0].text, final.choices[0].finish_reason) == (cut, "stop")
    assert streamed.get(("st", 0), "") == cut
    assert final.usage.completion_tokens < 40


async def test_cancel_ends_a_running_request_at_once(engine):
    engine.submit(request("long", "go", max_tokens=2000))
    async with asyncio.timeout(30):
        while not any(isinstance(e, ChunkEvent) for e in await engine.next_events()):
            pass
    engine.cancel("long")
    events = await engine.next_events()
    final = next(e for e in events if isinstance(e, FinalEvent))
    assert final.outcome is Outcome.CANCELED and final.usage.completion_tokens < 2000
    assert engine.capacity().running == 0
    finals, _ = await run(engine, request("after", "next", max_tokens=4))  # no late event of "long" shows up
    assert set(finals) == {"after"}


async def test_long_prompt_fits_and_overlong_is_rejected(engine):
    prompt = "x" * 8000
    finals, _ = await run(engine, request("big", prompt, max_tokens=8))
    assert finals["big"].usage.prompt_tokens == 8000 and finals["big"].usage.completion_tokens == 8
    with pytest.raises(InvalidRequest):
        engine.submit(request("huge", prompt, max_tokens=500))


async def test_save_pretrained_round_trip(tiny, tmp_path, engine):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = TransformersEngine.from_args(
        model_path=str(tmp_path), max_concurrent_sequences=4, max_batched_tokens=None, device="cpu"
    )
    try:
        theirs, _ = await run(loaded, request("rt", "round trip", max_tokens=16))
        ours, _ = await run(engine, request("rt", "round trip", max_tokens=16))
        assert theirs["rt"].choices[0].text == ours["rt"].choices[0].text
        assert theirs["rt"].usage == ours["rt"].usage
    finally:
        await loaded.close()


async def test_a_crashed_generation_loop_fails_shared_and_recovers(tiny):
    """Every request the crashed loop held fails (also one whose output never reaches the engine), and the next submit
    runs on a fresh manager. The crash waits for a gate, so no step depends on timing."""
    model, tokenizer = build_llmq_tiny()
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=4, context_window=8192)
    original = model.forward
    gate = threading.Event()

    def broken(*args, **kwargs):
        gate.wait(timeout=60)
        raise RuntimeError("boom")

    try:
        model.forward = broken
        engine.submit(request("x", "a", max_tokens=4))
        engine.submit(request("y", "b", max_tokens=4))
        engine.submit(request("lost", "c", max_tokens=4))
        engine._manager.output_router.result_handlers.pop("lost#0")  # as if added while the loop was failing the rest
        gate.set()
        finals = await collect_finals(engine, 3)
        assert {rid: (f.outcome, f.shared_failure) for rid, f in finals.items()} == {
            rid: (Outcome.ERRORED, True) for rid in ("x", "y", "lost")
        }
        assert engine.capacity().running == 0
        model.forward = original
        finals, _ = await run(engine, request("z", "c", max_tokens=4))
        assert finals["z"].outcome is Outcome.SUCCEEDED and finals["z"].usage.completion_tokens == 4
    finally:
        gate.set()
        model.forward = original
        await engine.close()


async def collect_finals(engine, count: int, timeout_s: float = 60) -> dict[str, FinalEvent]:
    finals = {}
    async with asyncio.timeout(timeout_s):
        while len(finals) < count:
            finals.update((e.request_id, e) for e in await engine.next_events() if isinstance(e, FinalEvent))
    return finals


async def test_a_seeded_sampled_request_run_alone_reproduces_exactly(engine):
    def seeded(rid, seed):
        return request(rid, "seed me", max_tokens=40, temperature=1.0, seed=seed)

    first, _ = await run(engine, seeded("s1", 1234))
    again, _ = await run(engine, seeded("s2", 1234))
    other, _ = await run(engine, seeded("s3", 99))
    text = first["s1"].choices[0].text
    assert len(text) > 5 and again["s2"].choices[0].text == text
    assert other["s3"].choices[0].text != text
    choices, _ = await run(engine, request("s4", "seed me", max_tokens=40, temperature=1.0, seed=1234, n=2))
    assert choices["s4"].choices[0].text != choices["s4"].choices[1].text  # each choice has its own generator


async def test_logit_bias_steers_only_its_own_request(engine, tiny):
    model, _ = tiny
    z = byte_tokenizer.encode("z")[0]
    reference = decode(greedy_ids(model, byte_tokenizer.encode("bias"), 12))
    finals, streamed = await run(
        engine,
        request("up", "bias", max_tokens=12, logit_bias={z: 100.0}),
        request("hot", "bias", max_tokens=12, temperature=1.0, logit_bias={z: 100.0}),
        request("plain", "bias", max_tokens=12),
    )
    assert finals["up"].choices[0].text == finals["hot"].choices[0].text == "z" * 12
    assert streamed[("up", 0)] == "z" * 12
    assert finals["plain"].choices[0].text == reference
    banned = byte_tokenizer.encode(reference[0])[0]
    down, _ = await run(engine, request("down", "bias", max_tokens=12, logit_bias={banned: -100.0}))
    assert reference[0] not in down["down"].choices[0].text


async def test_logit_bias_ids_outside_the_vocabulary_are_invalid(engine):
    with pytest.raises(InvalidRequest, match="logit_bias"):
        engine.submit(request("bad", "x", logit_bias={259: 1.0}))
    assert engine.capacity().running == 0


def test_a_row_is_drawn_by_inverse_cdf_or_takes_its_most_likely_token_when_greedy():
    from llmq_worker.engines.cb_processors import GREEDY, chosen

    logits = torch.log(torch.tensor([0.1, 0.0, 0.6, 0.3])).repeat(5, 1)
    draws = torch.tensor([0.05, 0.15, 0.69, 0.71, GREEDY])
    out = chosen(logits, draws)
    assert [int(row.argmax()) for row in out] == [0, 2, 2, 3, 2]
    assert torch.isinf(out).sum() == 5 * 3  # one possible token per row
    grid = (torch.arange(1000, dtype=torch.float32) + 0.5) / 1000  # cell midpoints: no ties at the edges
    picks = chosen(logits[:1].repeat(1000, 1), grid).argmax(dim=-1)
    assert torch.bincount(picks, minlength=4).tolist() == [100, 0, 600, 300]


def test_top_p_keeps_the_smallest_nucleus_and_temperature_scales_sampled_rows():
    from types import SimpleNamespace

    from llmq_worker.engines.cb_processors import Temperature, TopP

    def rows(**kwargs):
        return [SimpleNamespace(state=SimpleNamespace(logit_processor_kwargs=kwargs))]

    logits = torch.log(torch.tensor([[0.1, 0.05, 0.55, 0.3]]))
    top_p = TopP()
    kept = top_p(logits, top_p.prepare_tensor_args(rows(top_p=0.8)))
    assert torch.isinf(kept).tolist() == [[True, True, False, False]]  # 0.55 + 0.3 reach 0.8
    assert torch.equal(top_p(logits, top_p.prepare_tensor_args(rows(top_p=1.0))), logits)
    temperature = Temperature()
    assert torch.allclose(temperature(logits, temperature.prepare_tensor_args(rows(temperature=0.5))), logits * 2)
    assert torch.equal(temperature(logits, temperature.prepare_tensor_args(rows(greedy=True))), logits)


async def test_generation_stops_at_the_result_byte_cap(engine, monkeypatch):
    monkeypatch.setattr(engine, "_max_result_bytes", 12)  # the cap (MAX_RESULT_BYTES) scaled down to a short run
    finals, streamed = await run(engine, request("cap", "hello", max_tokens=200, n=2, temperature=1.0, seed=3))
    final = finals["cap"]
    assert final.outcome is Outcome.SUCCEEDED
    assert sum(len(c.text.encode()) for c in final.choices) <= 12
    assert [streamed.get(("cap", c.index), "") for c in final.choices] == [c.text for c in final.choices]
    assert "length" in {c.finish_reason for c in final.choices}
    assert final.usage.completion_tokens < 2 * 200  # generation stopped long before max_tokens


def test_generation_ends_at_every_end_token_of_the_model_and_its_tokenizer():
    from types import SimpleNamespace

    from llmq_worker.engines.transformers_engine import _generation_config

    model = SimpleNamespace(
        generation_config=SimpleNamespace(eos_token_id=[128001, 128009], pad_token_id=None),
        config=SimpleNamespace(eos_token_id=128001, vocab_size=128256),
    )
    end_of_turn = SimpleNamespace(eos_token_id=128008)
    assert _generation_config(model, end_of_turn).eos_token_id == [128001, 128008, 128009]
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    assert _generation_config(model, SimpleNamespace(eos_token_id=None)).eos_token_id == [-1]


def test_a_plain_prompt_gets_only_the_special_tokens_its_tokenizer_adds():
    from types import SimpleNamespace

    from llmq_worker.engines.codec import TextCodec

    class Tokenizer:
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return SimpleNamespace(input_ids=([1] if add_special_tokens else []) + [ord(c) for c in text])

    codec = TextCodec(Tokenizer())
    assert codec.prompt_ids(request("r", "ab")) == [1, 97, 98]


async def test_logprobs_are_the_models_raw_log_softmax_streamed_as_in_the_result(engine, tiny):
    model, _ = tiny
    asked = request("lp", "hello", max_tokens=6, logprobs=3, logit_bias={3 + ord("q"): 5.0})
    finals, chunks = {}, []
    for r in (asked, request("plain", "hello", max_tokens=6)):
        engine.submit(r)
    async with asyncio.timeout(60):
        while len(finals) < 2:
            for event in await engine.next_events():
                if isinstance(event, FinalEvent):
                    finals[event.request_id] = event
                elif event.request_id == "lp":
                    chunks += event.logprobs
                else:
                    assert event.logprobs is None
    (choice,) = finals["lp"].choices
    assert finals["plain"].choices[0].logprobs is None
    assert chunks == choice.logprobs and len(choice.logprobs) == finals["lp"].usage.completion_tokens
    prompt = byte_tokenizer.encode("hello")
    generated = [byte_tokenizer.BYTE_OFFSET + e.bytes[0] for e in choice.logprobs]
    with torch.no_grad():  # before logit_bias: the model's own distribution
        reference = model(torch.tensor([prompt + generated])).logits[0].float().log_softmax(-1)
    for k, e in enumerate(choice.logprobs):
        row = reference[len(prompt) - 1 + k]
        assert e.logprob == pytest.approx(row[generated[k]].item(), abs=1e-4)
        top = row.topk(3)
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [byte_tokenizer.BYTE_OFFSET + t.bytes[0] for t in e.top_logprobs] == top.indices.tolist()


class _State:
    """A manager's RequestState, as far as the logprob table uses it."""

    def __init__(self, request_id: str, alternatives: int | None) -> None:
        self.request_id = request_id
        self.logit_processor_kwargs = {} if alternatives is None else {"logprobs": alternatives}
        self.updates: list[tuple[int, object]] = []

    def update_and_check_completion(self, token_id: int, logprob) -> bool:
        self.updates.append((token_id, logprob))
        return False


@pytest.mark.parametrize("async_batching", [False, True])
def test_each_update_reads_the_logprobs_of_its_own_step_also_with_two_steps_in_flight(async_batching):
    """The manager's order: sync prepares, computes and updates step k in turn; async prepares k+1 before it updates
    k. Each step here gives its rows other logits, so a line read from the wrong step or half shows."""
    from types import SimpleNamespace

    from llmq_worker.engines import cb_logprobs

    manager = SimpleNamespace(batch_processor=SimpleNamespace(use_async_batching=async_batching))
    table = cb_logprobs.LogprobTable(manager, rows=2, device=torch.device("cpu"))
    raw, record = cb_logprobs.RawLogprobs(table), cb_logprobs.RecordLogprobs(table)
    asked, plain = _State("asked", 2), _State("plain", None)
    rows = [SimpleNamespace(state=asked), SimpleNamespace(state=plain)]
    vocab = 30

    def step_logits(step: int) -> torch.Tensor:
        return torch.arange(2 * vocab, dtype=torch.float32).view(2, vocab).roll(step, dims=1) / 7

    def compute(step: int) -> None:  # one forward: the processors around a greedy draw
        lines = raw.prepare_tensor_args(rows)
        scores = raw(step_logits(step), lines)
        chosen = torch.full_like(scores, float("-inf")).scatter(-1, scores.argmax(-1, keepdim=True), 0.0)
        record(chosen, record.prepare_tensor_args(rows))

    def update(step: int) -> None:
        for future in rows:
            future.state.update_and_check_completion(int(step_logits(step)[rows.index(future)].argmax()), None)

    steps = 4
    if async_batching:
        compute(0)
        for step in range(1, steps + 1):
            compute(step)
            update(step - 1)
    else:
        for step in range(steps):
            compute(step)
            update(step)
    for step, (token, (logprob, top)) in enumerate(asked.updates):
        expected = step_logits(step)[0].log_softmax(-1)
        assert token == int(expected.argmax())
        assert logprob == pytest.approx(expected[token].item())
        assert [i for i, _ in top] == expected.topk(2).indices.tolist()
    assert len(asked.updates) == steps and [lp for _, lp in plain.updates] == [None] * steps


async def test_prefix_cache_hits_are_reported_within_a_tenant_only(tiny):
    """The library's block sharing (pages of 64 tokens on CPU) reused across requests: a hit is counted in usage and
    the ledger, and the tenant salt keeps another tenant's identical prompt from reusing the blocks (unless shared)."""
    model, tokenizer = tiny
    header = "h" * 600  # byte tokens: nine whole pages and a part
    for scoped, rival_cached in ((True, 0), (False, 576)):
        ledger = PrefixLedger(budget_tokens=4096, tenant_scoped=scoped)
        engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=4, prefix_ledger=ledger)
        try:
            finals = {}
            for rid, tenant in (("cold", "acme"), ("warm", "acme"), ("rival", "rival")):
                one = msgspec.structs.replace(request(rid, header + rid, max_tokens=2), tenant_id=tenant)
                finals.update((await run(engine, one))[0])
        finally:
            await engine.close()
        cached = {rid: final.usage.cached_tokens for rid, final in finals.items()}
        assert cached == {"cold": 0, "warm": 576, "rival": rival_cached}, scoped
        # each tenant's four 128-byte blocks of the header (whole blocks only; the tails are past them)
        assert len(ledger) == (2 if scoped else 1) * (512 // PREFIX_BLOCK_BYTES)


async def test_the_prefix_cache_keeps_its_budget_evicting_the_least_recently_used_prompt(tiny):
    model, tokenizer = tiny
    ledger = PrefixLedger(budget_tokens=512)  # eight 64-token pages: most of one header's nine
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=4, prefix_ledger=ledger)
    cached = []
    try:
        for rid, header in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")):
            finals, _ = await run(engine, request(rid, header * 600 + rid, max_tokens=2))
            cached.append(finals[rid].usage.cached_tokens)
    finally:
        await engine.close()
    assert cached == [0, 0, 0, 512]  # b's pages pushed a's out; a's second run brought eight of them back


async def test_a_header_matched_again_outlives_one_off_prompts_within_the_budget(tiny):
    """A plain LRU of 16 pages would lose the header's pages to the 18 of three one-off prompts run after it; blocks a
    request matched count as used again, so the one-off pages go first."""
    model, tokenizer = tiny
    ledger = PrefixLedger(budget_tokens=1024)
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=4, prefix_ledger=ledger)
    cached = []
    try:
        for rid, prompt in zip(
            ("h1", "h2", "x", "y", "z", "h3"), ["h" * 600] * 2 + [c * 400 for c in "xyz"] + ["h" * 600]
        ):
            finals, _ = await run(engine, request(rid, prompt + rid, max_tokens=2))
            cached.append(finals[rid].usage.cached_tokens)
    finally:
        await engine.close()
    assert cached == [0, 576, 0, 0, 0, 576]


# --- continuations: a request resumed from the ids an earlier attempt generated ----------------------------------------


def continued(r: GenerationRequest, *token_ids: list[int]) -> GenerationRequest:
    return msgspec.structs.replace(r, continuation=Continuation(token_ids=list(token_ids)))


async def events_of(engine, r: GenerationRequest, timeout_s: float = 60) -> tuple[list[ChunkEvent], FinalEvent]:
    engine.submit(r)
    chunks = []
    async with asyncio.timeout(timeout_s):
        while True:
            for event in await engine.next_events():
                if isinstance(event, FinalEvent):
                    return chunks, event
                chunks.append(event)


async def test_a_greedy_continuation_resumes_at_its_exact_token_and_counts_each_token_once(engine):
    prompt = "The quick brown fox 🦊"
    whole_chunks, whole = await events_of(engine, request("whole", prompt, max_tokens=12))
    ids = [i for c in whole_chunks for i in c.token_ids]
    assert len(ids) == whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    k = 5
    chunks, final = await events_of(engine, continued(request("cont", prompt, max_tokens=12), ids[:k]))
    assert (chunks[0].text, chunks[0].token_ids) == (byte_tokenizer.IncrementalDetokenizer().push(ids[:k]), ())
    assert [i for c in chunks[1:] for i in c.token_ids] == ids[k:]  # only the rest was generated here
    assert final.choices == whole.choices
    assert final.usage == whole.usage  # prompt tokens the original's, each completion token once
    assert "".join(c.text for c in chunks) == whole.choices[0].text


@pytest.mark.parametrize(
    "ids, stop, text, reason, tokens",
    [
        (byte_tokenizer.encode("abcdef"), [], "abcdef", "length", 6),  # max_tokens reached
        ([*byte_tokenizer.encode("ab"), byte_tokenizer.EOS_ID], [], "ab", "stop", 3),  # it ended at an end token
        (
            byte_tokenizer.encode("abcd"),
            ["c"],
            "ab",
            "stop",
            3,
        ),  # a stop string in it: the ids after it are not counted
    ],
)
async def test_a_continuation_with_nothing_left_ends_at_once(engine, ids, stop, text, reason, tokens):
    r = continued(request("done", "xyz", max_tokens=6, stop=stop), ids)
    chunks, final = await events_of(engine, r, timeout_s=5)
    assert [(c.text, c.token_ids) for c in chunks] == [(text, ())]
    assert [(c.text, c.finish_reason) for c in final.choices] == [(text, reason)]
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, tokens)
    assert final.started_ms > 0 and engine.capacity().running == 0


# --- preemption: deferred work yields its slots to people and resumes from its tokens --------------------------------


def deferred(r: GenerationRequest) -> GenerationRequest:
    return msgspec.structs.replace(r, traffic_class="deferred")


async def until_tokens(engine, request_id: str, count: int, seen: list) -> None:
    """Collect events into ``seen`` until ``request_id`` has streamed ``count`` token ids."""
    async with asyncio.timeout(60):
        while sum(len(e.token_ids) for e in seen if e.request_id == request_id and isinstance(e, ChunkEvent)) < count:
            seen += await engine.next_events()


async def rest_of(engine, count: int, seen: list) -> list:
    """Collect events into ``seen`` until it holds ``count`` FinalEvents; returns the FinalEvents in arrival order."""
    async with asyncio.timeout(60):
        while sum(isinstance(e, FinalEvent) for e in seen) < count:
            seen += await engine.next_events()
    return [e for e in seen if isinstance(e, FinalEvent)]


@pytest.fixture
async def one_slot(tiny):
    model, tokenizer = tiny
    engines = []

    def make(**limits) -> TransformersEngine:
        engines.append(TransformersEngine(model, tokenizer, max_concurrent_sequences=1, context_window=8192, **limits))
        return engines[-1]

    yield make
    for engine in engines:
        await engine.close()


async def test_a_person_waiting_on_a_full_engine_preempts_deferred_work_which_resumes_with_each_token_once(one_slot):
    """One slot, held by a deferred generation: an interactive request preempts it and ends first; the deferred one
    resumes from its tokens and ends as it would have run alone (greedy), each token streamed and counted once."""
    engine = one_slot()
    long = deferred(request("long", "The quick brown fox", max_tokens=200))
    alone_chunks, alone = await events_of(engine, msgspec.structs.replace(long, request_id="alone"))
    seen: list = []
    engine.submit(long)
    await until_tokens(engine, "long", 5, seen)
    assert engine.capacity().preemptible == 1
    engine.submit(request("person", "hi", max_tokens=4))
    assert engine.capacity().preemptible == 0  # the deferred one waits, preempted
    finals = await rest_of(engine, 2, seen)
    assert [f.request_id for f in finals] == ["person", "long"]
    (final,) = [f for f in finals if f.request_id == "long"]
    assert final.outcome is Outcome.SUCCEEDED and final.choices == alone.choices and final.usage == alone.usage
    chunks = [e for e in seen if isinstance(e, ChunkEvent) and e.request_id == "long"]
    assert [i for c in chunks for i in c.token_ids] == [i for c in alone_chunks for i in c.token_ids]
    assert "".join(c.text for c in chunks) == final.choices[0].text
    stats = engine.preemption_stats
    assert (stats.preemptions, stats.resumes) == ({"interactive": 1}, 1)
    assert stats.recomputed_tokens >= final.usage.prompt_tokens + 5


async def test_without_preemptions_a_person_waits_for_the_deferred_work_and_deferred_work_never_preempts(one_slot):
    engine = one_slot(max_preemptions=0)
    seen: list = []
    engine.submit(deferred(request("long", "The quick brown fox", max_tokens=60)))
    await until_tokens(engine, "long", 5, seen)
    assert engine.capacity().preemptible == 0
    engine.submit(deferred(request("other", "hi", max_tokens=4)))
    engine.submit(request("person", "hi", max_tokens=4))
    finals = await rest_of(engine, 3, seen)
    assert [f.request_id for f in finals] == ["long", "person", "other"]  # people first among what waited
    assert engine.preemption_stats.preemptions == {}


async def test_a_preempted_request_cancelled_while_it_waits_ends_canceled_and_frees_nothing_twice(one_slot):
    engine = one_slot()
    seen: list = []
    engine.submit(deferred(request("long", "The quick brown fox", max_tokens=400)))
    await until_tokens(engine, "long", 5, seen)
    engine.submit(request("person", "hi", max_tokens=40))
    assert engine.preemption_stats.preemptions == {"interactive": 1}
    engine.cancel("long")
    finals = await rest_of(engine, 2, seen)
    assert {f.request_id: f.outcome for f in finals} == {"long": Outcome.CANCELED, "person": Outcome.SUCCEEDED}
    capacity = engine.capacity()
    assert (capacity.running, capacity.queued, capacity.preemptible, engine.preemption_stats.resumes) == (0, 0, 0, 0)


@pytest.fixture
def steps(monkeypatch) -> list[list[tuple[str, int]]]:
    """Each step the engines' scheduler plans: (manager request id, query tokens) per sequence."""
    planned: list[list[tuple[str, int]]] = []
    schedule = cb_scheduler.PeopleFirstScheduler.schedule_batch

    def recording(self, token_budget, cache_budget):
        out = schedule(self, token_budget, cache_budget)
        planned.append([(f.state.request_id, f.query_length) for f in out[0] or ()])
        return out

    monkeypatch.setattr(cb_scheduler.PeopleFirstScheduler, "schedule_batch", recording)
    return planned


def prefill_step(steps: list[list[tuple[str, int]]], manager_id: str) -> list[str]:
    """The sequences of the step that prefilled ``manager_id``'s prompt (its first step)."""
    return next([rid for rid, _ in step] for step in steps if any(rid == manager_id for rid, _ in step))


async def test_a_persons_prompt_is_prefilled_in_a_step_without_the_deferred_sequences_which_decode_on_after(
    tiny, steps
):
    """Two slots, one decoding a deferred generation: the interactive prompt's step holds only it (on the library's
    FIFO scheduler it would hold the deferred decode too); the deferred sequence decodes in the steps before and after.
    A deferred prompt arriving the same way shares its step, as FIFO plans it."""
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=2, context_window=8192)
    try:
        for person, traffic_class in (("person", "interactive"), ("late", "deferred")):
            seen: list = []
            long = deferred(request(f"long-{person}", "The quick brown fox", max_tokens=80))
            engine.submit(long)
            await until_tokens(engine, long.request_id, 5, seen)
            prompt = request(person, "a prompt of a person " * 4, max_tokens=4)
            engine.submit(msgspec.structs.replace(prompt, traffic_class=traffic_class))
            finals = {f.request_id: f for f in await rest_of(engine, 2, seen)}
            step = prefill_step(steps, f"{person}#0")
            assert step == ([f"{person}#0"] if person == "person" else [f"{long.request_id}#0", f"{person}#0"])
            held = [i for i, s in enumerate(steps) if any(rid == f"{long.request_id}#0" for rid, _ in s)]
            assert held[-1] > steps.index(next(s for s in steps if [rid for rid, _ in s] == step))
            assert {f.outcome for f in finals.values()} == {Outcome.SUCCEEDED}
    finally:
        await engine.close()
    assert cb_scheduler.PEOPLE == set()  # every id the engine added left with its request

"""The result byte cap (issue 12): every engine stops a request where the UTF-8 bytes of its choices' text reach the
cap (MAX_RESULT_BYTES by default), cuts at a character boundary, ends ``length`` and counts only the tokens it kept."""

from __future__ import annotations

import asyncio

from llmq_core.constants import MAX_RESULT_BYTES
from llmq_core.tokenizer import encode
from llmq_core.wire import Outcome
from llmq_worker.engines.simulated import SimulatedEngine
from llmq_worker.text import ChoiceText, ResultBudget
from tests.unit.worker.worker_fakes import ScriptedClient, drain, make_request, scripted_vllm


def test_budget_cuts_at_a_character_boundary_and_then_takes_nothing():
    budget = ResultBudget(5)
    assert budget.take("ab") == "ab" and budget.left_bytes == 3
    assert budget.take("é😀") == "é"  # 2 + 4 bytes: the emoji does not fit whole
    assert budget.exhausted and budget.take("c") == ""  # nothing may follow text that was dropped


def test_choices_sharing_a_budget_stop_at_the_cap_and_count_the_tokens_they_used():
    budget = ResultBudget(7)
    first, second = ChoiceText([], budget=budget), ChoiceText([], budget=budget)
    assert first.push(encode("abcd")) == "abcd" and not first.done
    assert second.push(encode("wxyz")) == "wxy" and second.capped  # "y" reached the cap: "z" is never taken
    assert first.push(encode("e")) == "" and first.capped
    assert (first.text, first.tokens, second.text, second.tokens) == ("abcd", 4, "wxy", 3)
    assert first.finish() == second.finish() == ""
    assert first.finish_reason(natural_end=True) == second.finish_reason(natural_end=True) == "length"


def test_a_stop_string_still_wins_before_the_cap():
    choice = ChoiceText(["b"], budget=ResultBudget(3))
    assert choice.push(encode("abcdef")) == "a" and choice.stopped and not choice.capped
    assert choice.finish_reason(natural_end=False) == "stop"


def test_held_back_text_released_at_the_end_is_capped_too():
    choice = ChoiceText(["xyz"], budget=ResultBudget(3))
    assert choice.push(encode("abxy")) == "ab"  # "xy" may start the stop string: held back
    assert choice.finish() == "x" and choice.capped and choice.text == "abx"


# --- every engine ------------------------------------------------------------------------------------------------------


async def test_simulated_engine_stops_each_request_at_its_cap(manual_time):
    engine = SimulatedEngine(
        max_batch_size=4, batch_time_ms=100, clock=manual_time.clock, sleep=manual_time.sleep, max_result_bytes=10
    )
    engine.submit(make_request("big", "héllo", max_tokens=6, n=3))
    engine.submit(make_request("small", "ok", max_tokens=4))
    await manual_time.advance(100)
    finals = {}
    while len(finals) < 2:
        finals.update({e.request_id: e for e in await engine.next_events() if hasattr(e, "outcome")})
    big, small = finals["big"], finals["small"]
    texts = [c.text for c in big.choices]
    assert big.outcome is Outcome.SUCCEEDED and 9 <= sum(len(t.encode()) for t in texts) <= 10
    assert all("héllo".startswith(t) for t in texts)  # cut at the cap, never inside the 2-byte é
    assert [c.finish_reason for c in big.choices] == ["length"] * 3
    assert big.usage.completion_tokens < 3 * 6
    assert (small.choices[0].text, small.choices[0].finish_reason) == ("okok", "length")  # its own budget
    await engine.close()


async def test_simulated_engine_caps_the_issue_sized_request_at_max_result_bytes(manual_time):
    engine = SimulatedEngine(
        max_batch_size=1, batch_time_ms=10, context_window=1 << 20, clock=manual_time.clock, sleep=manual_time.sleep
    )
    engine.submit(make_request("huge", "x", max_tokens=8190, n=200))  # Kafka-direct: no API check in front of it
    finals = []
    for _ in range(1000):  # its 200 choices take turns with the rest of the loop, one choice a turn
        await manual_time.advance(10)
        while not finals and not engine._events._queue.empty():
            finals += [e for e in await engine.next_events() if hasattr(e, "outcome")]
        if finals:
            break
    (final,) = finals
    assert sum(len(c.text.encode()) for c in final.choices) == MAX_RESULT_BYTES
    assert final.usage.completion_tokens == MAX_RESULT_BYTES  # one byte per token of llmq-sim
    assert {c.finish_reason for c in final.choices} == {"length"}
    await engine.close()


async def test_vllm_engine_aborts_choices_at_the_cap():
    client = ScriptedClient()
    engine = scripted_vllm(client, max_num_seqs=4, max_result_bytes=9)
    engine.submit(make_request("v", "abcdefgh", max_tokens=8, n=2, temperature=1.0))
    finals, streamed = await drain(engine, 1)
    final = finals["v"]
    texts = [c.text for c in final.choices]
    assert final.outcome is Outcome.SUCCEEDED and sum(len(t) for t in texts) == 9
    assert [streamed.get(("v", i), "") for i in range(2)] == texts
    assert [c.finish_reason for c in final.choices] == ["length", "length"]
    assert final.usage.completion_tokens < 16
    await asyncio.sleep(0)
    assert sorted(client.aborted) == ["v#0", "v#1"]  # closing generate() early aborts in vLLM
    await engine.close()

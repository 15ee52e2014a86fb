"""Structured outputs on the real model (smollm2-135m-instruct, installed by ``make setup``; the transformers engine on
CPU, no stack): every constrained answer parses and validates against its schema at temperature 0 and 1, tool
constraints give calls whose arguments validate, and a grammar compiles once per schema."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from llmq_core import structured
from llmq_core.constants import JSON_OBJECT, TOOL_CHOICE_REQUIRED
from llmq_core.models import SMOLLM2_135M_INSTRUCT
from llmq_core.settings import Settings
from llmq_core.wire import Outcome, Structured, Tool
from llmq_worker import checkpoints
from llmq_worker.engine import FinalEvent
from tests.structured_cases import SCHEMAS, chat

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def engine():
    # torch and transformers (seconds to import) only when these tests run, not in every collection of the tier
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llmq_worker.engines.transformers_engine import TransformersEngine

    try:
        path = checkpoints.installed_path(SMOLLM2_135M_INSTRUCT, checkpoints.models_root(Settings().models.dir))
    except checkpoints.CheckpointError as exc:
        pytest.fail(f"{exc} (make setup installs it)")
    engine = TransformersEngine.from_args(
        model_path=str(path), max_concurrent_sequences=8, max_batched_tokens=None, device="cpu"
    )
    yield engine
    await engine.close()


async def finals(engine, *requests, timeout_s: float = 240) -> dict[str, FinalEvent]:
    for r in requests:
        engine.submit(r)
    done: dict[str, FinalEvent] = {}
    async with asyncio.timeout(timeout_s):
        while len(done) < len(requests):
            done.update({e.request_id: e for e in await engine.next_events() if isinstance(e, FinalEvent)})
    return done


async def test_every_answer_parses_and_validates_at_temperature_0_and_1(engine):
    requests = [
        chat(f"{name}-{t}", t, structured.json_schema_constraint(name, schema))
        for name, schema in SCHEMAS.items()
        for t in (0.0, 1.0)
    ]
    # Any object (free keys and strings) lets this small model wander on until max_tokens cuts it off: ``length``,
    # text that does not parse, as documented. What the grammar holds is its start: an object.
    requests.append(chat("object-0", 0.0, Structured(kind=JSON_OBJECT)))
    results = await finals(engine, *requests)
    for request in requests:
        final = results[request.request_id]
        assert final.outcome is Outcome.SUCCEEDED, final.error
        choice = final.choices[0]
        if request.structured.kind == JSON_OBJECT:
            assert choice.text.startswith('{"') and choice.finish_reason in ("stop", "length")
            continue
        assert choice.finish_reason == "stop", (request.request_id, choice.text)
        jsonschema.validate(json.loads(choice.text), json.loads(request.structured.schema))
    assert engine.grammar_stats.compiles == len(SCHEMAS) + 1  # one per schema: the second request of each hits
    assert engine.grammar_stats.hits == len(SCHEMAS)


async def test_a_required_tool_choice_answers_calls_whose_arguments_validate(engine):
    weather = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    tools = [Tool(name="get_weather", parameters=structured.compact(weather)), Tool(name="noop")]
    forced = [
        # one call (parallel_tool_calls false): every answer these grammars allow closes within MAX_TOKENS, whatever is drawn
        chat(
            "required", 1.0, structured.tool_constraint(tools, "", False), tools=tools, tool_choice=TOOL_CHOICE_REQUIRED
        ),
        chat(
            "named", 0.0, structured.tool_constraint(tools, "get_weather", False), tools=tools, tool_choice="function"
        ),
    ]
    results = await finals(engine, *forced)
    for request in forced:
        choice = results[request.request_id].choices[0]
        assert choice.tool_calls and choice.text == "", choice
        for call in choice.tool_calls:
            if call.name == "get_weather":
                jsonschema.validate(json.loads(call.arguments), weather)
    named = results["named"].choices[0].tool_calls
    assert [c.name for c in named] == ["get_weather"]
    assert engine.grammar_stats.tool_call_parse_failures == 0

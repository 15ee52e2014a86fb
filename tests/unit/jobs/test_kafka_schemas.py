"""The Kafka-direct producer format: committed JSON Schemas equal the generated ones; the documented examples decode."""

import re
from pathlib import Path

import msgspec
import pytest

from llmq_core import schemas, wire

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("name", sorted(schemas.SCHEMAS))
def test_committed_schema_equals_the_generated_one(name):
    committed = (DOCS / "schemas" / name).read_text()
    assert committed == schemas.render()[name], f"regenerate: python -m llmq_core.schemas docs/schemas ({name})"


def example(marker: str) -> bytes:
    text = (DOCS / "kafka-producers.md").read_text()
    match = re.search(rf"<!-- example:{marker} -->\n```json\n(.*?)\n```", text, re.S)
    assert match, f"docs/kafka-producers.md lost its {marker} example"
    return match.group(1).encode()


def test_the_documented_request_is_a_valid_generation_request_with_a_kafka_reply():
    request = wire.decode(example("generation_request"), "application/json")
    assert isinstance(request, wire.GenerationRequest)
    assert isinstance(request.reply_to, wire.KafkaReply) and request.reply_to.topic == "claims-etl.replies"
    assert request.traffic_class == "deferred" and request.messages and request.prompt is None


def test_the_documented_answer_is_a_valid_final_result():
    result = msgspec.json.decode(example("final_result"), type=wire.FinalResult)
    assert result.outcome is wire.Outcome.SUCCEEDED
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_schema_names_every_required_request_field():
    schema = msgspec.json.decode(schemas.render()["generation_request.schema.json"])
    required = set(schema["$defs"]["GenerationRequest"]["required"])
    assert {"request_id", "model", "created_ms", "deadline_ms", "reply_to"} <= required

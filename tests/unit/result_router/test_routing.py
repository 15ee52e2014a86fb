import msgspec
import pytest

from llmq_core import wire
from llmq_core.constants import CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK
from llmq_result_router.routing import plan_delivery


def _result(reply_to) -> wire.FinalResult:
    return wire.FinalResult(
        request_id="r1",
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=reply_to,
        choices=[wire.Choice(index=0, text="abc", finish_reason="length")],
    )


def test_http_result_is_only_stored():
    delivery = plan_delivery(_result(wire.HttpReply(instance_id="api-0")))
    assert delivery.reply_topic is None and delivery.reply_value is None
    assert wire.decode(delivery.store) == _result(wire.HttpReply(instance_id="api-0"))


@pytest.mark.parametrize("content_type", [CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK])
def test_kafka_result_is_encoded_as_its_producer_asked(content_type):
    result = _result(wire.KafkaReply(topic="team.replies", content_type=content_type))
    delivery = plan_delivery(result)
    assert delivery.reply_topic == "team.replies"
    assert delivery.reply_content_type == content_type
    assert wire.decode(delivery.reply_value, content_type) == result
    if content_type == CONTENT_TYPE_JSON:
        assert msgspec.json.decode(delivery.reply_value)["choices"][0]["text"] == "abc"

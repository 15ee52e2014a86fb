import msgspec
import pytest
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types.chat import ChatCompletion

from llmq_core import ids, wire
from llmq_core.constants import CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK
from llmq_core.status import ErrorCode
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


def test_a_kafka_reply_carries_the_producers_own_id_and_the_store_the_scoped_one():
    """Issue 34 item 1: Kafka-direct ids run tenant-scoped; the producer knows only the id it gave."""
    scoped = msgspec.structs.replace(
        _result(wire.KafkaReply(topic="acme.replies")), request_id=ids.tenant_scoped_id("acme", "order-1")
    )
    delivery = plan_delivery(scoped)
    assert delivery.reply_key == b"order-1" and wire.decode(delivery.reply_value).request_id == "order-1"
    assert delivery.request_id == scoped.request_id and wire.decode(delivery.store) == scoped


def test_a_result_refused_for_its_reply_topic_is_never_produced_there():
    """The batcher refuses an ingress record naming another producer's topic (``invalid_reply_topic``); the router,
    which knows no producer, must not write that refusal into the topic either."""
    refused = msgspec.structs.replace(
        _result(wire.KafkaReply(topic="beta.replies")),
        outcome=wire.Outcome.ERRORED,
        choices=[],
        error=wire.ErrorInfo(type="invalid_request_error", code=ErrorCode.INVALID_REPLY_TOPIC, message="not yours"),
    )
    delivery = plan_delivery(refused)
    assert delivery.undeliverable == "not yours" and delivery.store is not None and not delivery.delivered_key
    assert delivery.reply_content_type == "application/json"  # what is dead-lettered: the reply, in its format
    assert msgspec.json.decode(delivery.reply_value)["error"]["code"] == ErrorCode.INVALID_REPLY_TOPIC


def _api_reply(outcome=wire.Outcome.SUCCEEDED, content_type=CONTENT_TYPE_JSON, **fields) -> dict:
    """The reply value of a Kafka-direct chat result whose producer asked for its API's result line (body ``api``)."""
    reply = wire.KafkaReply(topic="acme.replies", content_type=content_type, body="api")
    result = msgspec.structs.replace(
        _result(reply),
        request_id=ids.tenant_scoped_id("acme", "order-7"),
        endpoint="chat.completions",
        outcome=outcome,
        **fields,
    )
    value = plan_delivery(result).reply_value
    return msgspec.json.decode(value) if content_type == CONTENT_TYPE_JSON else msgspec.msgpack.decode(value)


@pytest.mark.parametrize("content_type", [CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK])
def test_an_api_body_reply_is_openais_batch_output_line_under_the_producers_id(content_type):
    line = _api_reply(content_type=content_type)
    assert line["custom_id"] == "order-7" and line["error"] is None
    response = line["response"]
    assert response["status_code"] == 200 and response["request_id"] == "order-7"
    ChatCompletion.model_validate(response["body"])  # the SDK's own model parses it
    assert response["body"]["choices"][0]["message"] == {"role": "assistant", "content": "abc"}


def test_an_api_body_reply_of_an_expired_request_is_its_http_answer_not_a_batch_expiry():
    line = _api_reply(wire.Outcome.EXPIRED, choices=[])
    assert line["response"]["status_code"] == 504 and line["error"] is None
    assert line["response"]["body"]["error"]["code"] == ErrorCode.DEADLINE_EXCEEDED


def test_an_api_body_reply_in_anthropics_format_is_a_message_batch_result_line():
    succeeded = _api_reply(api_format="anthropic")
    parsed = MessageBatchIndividualResponse.model_validate(succeeded)
    assert parsed.custom_id == "order-7" and parsed.result.type == "succeeded"
    assert parsed.result.message.content[0].text == "abc" and parsed.result.message.stop_reason == "max_tokens"
    invalid = wire.ErrorInfo(type="invalid_request_error", code="invalid_value", param="messages", message="no")
    errored = _api_reply(wire.Outcome.ERRORED, api_format="anthropic", choices=[], error=invalid)
    parsed = MessageBatchIndividualResponse.model_validate(errored)
    assert parsed.result.type == "errored" and parsed.result.error.error.type == "invalid_request_error"
    assert _api_reply(wire.Outcome.CANCELED, api_format="anthropic", choices=[])["result"] == {"type": "canceled"}

"""The batcher's tail of llmq.results settles a request only with a result of the request's own tenant: it reads the
tenant of each record (msgpack or JSON, as wire.decode does) and nothing from a record that names none."""

from types import SimpleNamespace

import pytest

from llmq_batcher.signals import result_tenant
from llmq_core import constants, wire

RESULT = wire.FinalResult(
    request_id="r1",
    tenant_id="acme",
    outcome=wire.Outcome.SUCCEEDED,
    model="llmq-sim",
    reply_to=wire.HttpReply(instance_id="pod"),
)
JSON = [(constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_JSON.encode())]


@pytest.mark.parametrize(
    ("value", "headers", "tenant"),
    [
        (wire.encode(RESULT), [], "acme"),
        (wire.encode(RESULT, constants.CONTENT_TYPE_JSON), JSON, "acme"),
        (wire.encode(RESULT, constants.CONTENT_TYPE_JSON), [], "acme"),  # JSON without its header, as wire.decode
        (b"\xc1 not msgpack", [], None),
        (None, [], None),
        (b'{"request_id": "r1"}', JSON, None),  # names no tenant
        (wire.encode(RESULT), [(constants.HEADER_CONTENT_TYPE, b"\xff")], None),
    ],
)
def test_the_tenant_a_results_record_names(value, headers, tenant):
    assert result_tenant(SimpleNamespace(value=value, headers=headers)) == tenant

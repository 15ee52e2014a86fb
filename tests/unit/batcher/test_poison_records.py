"""Records no decoder can take go to the dead letters like any other bad record: they used to raise out of ingest
(RecursionError, UnicodeDecodeError, TypeError), restart the consume task and silently drop the rest of the fetch, and
pin the partition's commit position on the poison record."""

from __future__ import annotations

import pytest

from llmq_core import constants
from tests.fakes import Record
from tests.unit.batcher.helpers import INTERACTIVE, NAMES

DEEP_JSON = b'{"type":"generation_request","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
DEEP_MSGPACK = b"\x91" * 100_000 + b"\x90"
JSON_HEADER = ((constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_JSON.encode()),)


@pytest.mark.parametrize(
    "value,headers",
    [
        (DEEP_JSON, JSON_HEADER),
        (DEEP_MSGPACK, ()),
        (b'{"type":"cancel","request_id":"r1"}', ((constants.HEADER_CONTENT_TYPE, b"\xff\xfe"),)),
        (None, ()),
        (b"", ()),
    ],
)
async def test_poison_record_is_dead_lettered_and_settled(batcher, value, headers):
    loop, consumer, producer, _ = batcher
    await loop.ingest(INTERACTIVE, Record(offset=3, value=value, headers=headers, key=b"k"))
    await loop.step(drain=True)
    (dead,) = producer.on(NAMES.dead_letters_topic)
    assert dead["value"] == value and dead["key"] == b"k"
    assert consumer.commits == [{INTERACTIVE: 4}]

"""Services refuse to start when an llmq topic's max.message.bytes is below KAFKA_MAX_MESSAGE_BYTES (a real worker
process against the real broker)."""

from __future__ import annotations

import asyncio

import pytest

from llmq_core.constants import (
    KAFKA_MAX_MESSAGE_BYTES,
    TOPIC_DEAD_LETTERS,
)
from llmq_core.kafka import (
    check_topic_limits,
    ensure_topics,
)
from tests.inprocess.test_result_limits import MODEL, PARTITION, SMALL_LIMIT_BYTES, set_topic_limit
from tests.stacks import worker_process

pytestmark = pytest.mark.integration


async def test_services_refuse_to_start_when_a_topic_limit_is_too_small(settings):
    await check_topic_limits(settings)  # the suite's broker: every llmq topic is large enough
    await set_topic_limit(settings, TOPIC_DEAD_LETTERS, SMALL_LIMIT_BYTES)
    try:
        process = await worker_process(
            settings,
            "itest-refused",
            PARTITION,
            MODEL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            _, stderr = await process.communicate()
        message = stderr.decode()
        assert process.returncode != 0
        assert f"{TOPIC_DEAD_LETTERS} has {SMALL_LIMIT_BYTES}" in message and str(KAFKA_MAX_MESSAGE_BYTES) in message
        assert "kafka-configs.sh" in message  # how to fix it
    finally:
        await ensure_topics(settings, raise_limits=True)  # what `llmq dev up` and `llmq topics` do to a local broker
    await check_topic_limits(settings)

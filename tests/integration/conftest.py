"""Fixtures the integration tests share."""

from __future__ import annotations

import os

import pytest

from llmq_core.settings import Settings


@pytest.fixture
def settings() -> Settings:
    """Settings for the suite's Kafka and Redis (the ``infra`` fixture exports where they are)."""
    return Settings(
        kafka={"bootstrap_servers": os.environ.get("LLMQ_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")},
        redis={"url": os.environ.get("LLMQ_REDIS_URL", "redis://127.0.0.1:6379/0")},
    )

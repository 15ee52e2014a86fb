"""Test infrastructure: a real Kafka broker and a real Redis for every integration test.

When ``LLMQ_KAFKA_BOOTSTRAP_SERVERS`` is set, the suite uses the Kafka and Redis the environment names. Otherwise it starts
its own broker (127.0.0.1:19092) and Redis (127.0.0.1:16379) as processes under ``var/test`` and stops them at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmq_cli.devstack import DevStack, StackConfig

ROOT = Path(__file__).resolve().parent.parent
TEST_KAFKA_PORT = 19092
TEST_REDIS_PORT = 16379


def _infra_stack() -> DevStack:
    return DevStack(
        StackConfig(state_dir=ROOT / "var" / "test", kafka_port=TEST_KAFKA_PORT, redis_port=TEST_REDIS_PORT)
    )


def pytest_collection_modifyitems(config, items):
    needs_infra = any(item.get_closest_marker("integration") for item in items)
    config._llmq_needs_infra = needs_infra


@pytest.fixture(scope="session", autouse=True)
def infra(request):
    """Kafka + Redis for the session; exports LLMQ_KAFKA_BOOTSTRAP_SERVERS / LLMQ_REDIS_URL to code under test."""
    if os.environ.get("LLMQ_KAFKA_BOOTSTRAP_SERVERS") or not getattr(request.config, "_llmq_needs_infra", False):
        yield None
        return
    stack = _infra_stack()
    stack.up(services=False, log=lambda *_: None)
    os.environ["LLMQ_KAFKA_BOOTSTRAP_SERVERS"] = stack.cfg.kafka_bootstrap
    os.environ["LLMQ_REDIS_URL"] = stack.cfg.redis_url
    yield stack
    stack.down()

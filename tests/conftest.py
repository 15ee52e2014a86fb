"""Test infrastructure: a real Kafka broker and a real Redis for every integration test.

When ``LLMQ_KAFKA_BOOTSTRAP_SERVERS`` is set, the suite uses the Kafka and Redis the environment names. Otherwise it starts
its own and stops them at the end: a broker and Redis as processes under ``var/test`` on ports allocated for the run,
or, with ``LLMQ_TEST_INFRA=containers`` (``make test-containers``), testcontainers' containers of the images ``make
images`` builds; an engine that answers never decides it (tests/infra.py, tests/ports.py).

Tiers (docs/running.md): ``tests/unit`` pure logic; ``tests/inprocess`` services' loops in this process against
that Kafka and Redis (``make check`` runs both); ``tests/system`` real processes, faults, regions, secure mode, the real
model (``make test`` runs ``check``, then this).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmq_core.settings import Settings
from tests.infra import infra_kind, secure_suite_infra, suite_infra

ROOT = Path(__file__).resolve().parent.parent


# Under pytest-xdist (the system tier, Makefile `test`): this worker's name (gw0, gw1, ...), or "" in one process
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_collection_modifyitems(config, items):
    needs_infra = any(item.get_closest_marker("integration") for item in items)
    config._llmq_needs_infra = needs_infra
    # Longest files first (`--dist loadfile --no-loadscope-reorder` hands files out in this order): one started last
    # would end the lane alone.
    items.sort(key=lambda item: -(long.args[0] if (long := item.get_closest_marker("long")) else 0))


def _state_dir(name: str) -> Path:
    """Where a suite-wide broker and Redis keep their state: one folder per xdist worker."""
    return ROOT / "var" / (f"{name}-{WORKER}" if WORKER else name)


@pytest.fixture(scope="session", autouse=True)
def infra(request):
    """Kafka + Redis for the session; exports LLMQ_KAFKA_BOOTSTRAP_SERVERS / LLMQ_REDIS_URL to code under test."""
    if os.environ.get("LLMQ_KAFKA_BOOTSTRAP_SERVERS") or not getattr(request.config, "_llmq_needs_infra", False):
        yield None
        return
    with suite_infra(_state_dir("test"), os.environ.get("DOCKER_HOST"), infra_kind()) as stack:
        os.environ["LLMQ_KAFKA_BOOTSTRAP_SERVERS"] = stack.cfg.kafka_bootstrap
        os.environ["LLMQ_REDIS_URL"] = stack.cfg.redis_url
        yield stack


@pytest.fixture(scope="session")
def secure_infra():
    """A secure Kafka + Redis for the session (tests/infra.py ``secure_suite_infra``), started on first use. Clients
    take their role's connection settings from ``secure_infra.cfg.settings(role)`` / ``.env(role)``."""
    with secure_suite_infra(_state_dir("test-secure")) as stack:
        yield stack


@pytest.fixture
def settings() -> Settings:
    """Settings for the suite's Kafka and Redis (the ``infra`` fixture exports where they are)."""
    return Settings(
        kafka={"bootstrap_servers": os.environ.get("LLMQ_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")},
        redis={"url": os.environ.get("LLMQ_REDIS_URL", "redis://127.0.0.1:6379/0")},
    )

"""Private stacks of llmq services on the test suite's own Kafka broker and Redis (``infra`` in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest

from llmq_cli.devstack import DevStack


@contextlib.contextmanager
def private_stack(infra: DevStack | None, timeout_s: float = 240, **config) -> Iterator[DevStack]:
    """The services of a DevStack whose StackConfig is ``infra``'s with ``config`` replaced, up for the ``with`` block
    (the suite's broker and Redis stay up). Skips when the suite runs on Kafka/Redis named by the environment."""
    if infra is None:
        pytest.skip("needs the suite's own Kafka/Redis (LLMQ_KAFKA_BOOTSTRAP_SERVERS is set)")
    running = DevStack(dataclasses.replace(infra.cfg, **config))
    try:
        running.up(timeout_s=timeout_s, log=lambda *_: None)
        yield running
    finally:
        running.down(services_only=True)

"""Fixtures of the batcher's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.batcher.helpers import make_loop


@pytest.fixture
def batcher():
    """A loop on fakes: (loop, consumer, producer, redis)."""
    return make_loop()

"""Fixtures of the worker's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.worker.worker_fakes import ManualTime


@pytest.fixture
def manual_time() -> ManualTime:
    return ManualTime()

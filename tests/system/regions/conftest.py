"""One pair of regions for every test of this package: a and b as whole secure stacks (Kafka SASL_SSL with ACLs, Redis
TLS, one principal per role, as production runs them) on this machine, with MirrorMaker 2 both ways signing in as
``mm2`` (``two_regions``). Started once for the package and removed after it, so its tests run in file order on the
same clusters: each leaves both regions serving (a test that kills a region revives it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra import SECURE_REPLY_TOPIC_PREFIXES
from tests.stacks import two_regions

STATE = Path(__file__).resolve().parents[3] / "var" / "test-regions"
SIM_BATCH_TIME_MS = 100
SIM_MAX_BATCH_SIZE = 16


@pytest.fixture(scope="package")
def regions():
    with two_regions(
        STATE,
        secure=True,
        reply_topic_prefixes=SECURE_REPLY_TOPIC_PREFIXES,  # the router's write ACLs: the Kafka-direct tests' replies
        tiny_workers=0,
        sim_workers=1,
        sim_batch_time_ms=SIM_BATCH_TIME_MS,
        sim_max_batch_size=SIM_MAX_BATCH_SIZE,
    ) as running:
        yield running

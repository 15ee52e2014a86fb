"""The region (LLMQ_REGION) in ids, settings, metrics and log lines; a region's share of a tenant's limits."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from llmq_api.auth import KeyEntry, KeyStore, regional_limit
from llmq_core import ids, metrics
from llmq_core.labels import LabelSet
from llmq_core.settings import Settings
from llmq_core.telemetry import JsonFormatter


def test_ids_say_where_they_were_born_and_do_not_repeat():
    assert ids.instance_id("eu-1", "batcher-0") == "eu-1-batcher-0"
    assert ids.instance_id("eu-1", "eu-1-batcher-0") == "eu-1-batcher-0"  # qualified once, however often asked
    request_ids = {ids.request_id("eu-1", "chatcmpl") for _ in range(100)}
    assert len(request_ids) == 100 and all(r.startswith("chatcmpl-eu-1-") for r in request_ids)
    assert ids.batch_job_id("us").startswith("batch_us-") and ids.file_id("us").startswith("file-us-")
    assert ids.batch_id_prefix("us-batcher-0").startswith("us-batcher-0-")
    assert ids.batch_id_prefix("us-batcher-0") != ids.batch_id_prefix("us-batcher-0")  # restarts never reuse one


@pytest.mark.parametrize("bad", ["", "A", "eu_1", "eu.1", "-eu", "eu-", "x" * 33])
def test_a_region_name_that_cannot_prefix_topics_and_ids_is_refused(bad):
    with pytest.raises(ValidationError, match="region"):
        Settings(region={"name": bad})


def test_every_metric_carries_the_region_label():
    m = metrics.BatcherMetrics(LabelSet(region="eu-1"))
    m.requests.labels("interactive", "llmq-sim").inc()
    worker = metrics.WorkerMetrics("llmq-sim", "eu-1")
    samples = [line for text in (m.render(), worker.render()) for line in text.decode().splitlines()]
    values = [line for line in samples if not line.startswith("#")]
    assert values and all('region="eu-1"' in line for line in values)
    assert (
        m.registry.get_sample_value(
            "llmq_batcher_requests_total", {"traffic_class": "interactive"} | {"model": "llmq-sim"}
        )
        == 1
    )
    assert (
        m.registry.get_sample_value(
            "llmq_batcher_requests_total", {"traffic_class": "interactive", "model": "llmq-sim", "region": "other"}
        )
        is None
    )


def test_every_log_line_carries_the_region():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    assert json.loads(JsonFormatter("batcher", "eu-1").format(record))["region"] == "eu-1"


@pytest.mark.parametrize(
    ("global_limit", "share", "regional"), [(0, 0.5, 0), (1000, 0.5, 500), (1000, 0.333, 333), (1, 0.1, 1), (7, 1, 7)]
)
def test_a_region_enforces_its_share_of_a_global_limit(global_limit, share, regional):
    assert regional_limit(global_limit, share) == regional


def test_the_keys_files_limits_are_shared_by_the_regions():
    store = KeyStore({}, limit_share=0.25)
    store.add([KeyEntry(tenant="t", key="k", requests_per_min=100, tokens_per_min=4000, batch_tokens_per_day=8)])
    principal = store.authenticate("Bearer k")
    assert (principal.requests_per_min, principal.tokens_per_min, principal.batch_tokens_per_day) == (25, 1000, 2)


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValidationError, match="limit_share"):
        Settings(region={"limit_share": share})

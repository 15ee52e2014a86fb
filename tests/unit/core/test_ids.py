"""Ids (llmq_core.ids): Kafka-direct request ids are scoped by their tenant (issue 34 item 1)."""

from __future__ import annotations

import pytest

from llmq_core import ids


def test_kafka_direct_ids_are_scoped_by_tenant_and_give_back_the_producers_id():
    acme, beta = ids.tenant_scoped_id("acme", "order:1"), ids.tenant_scoped_id("beta", "order:1")
    assert acme != beta and ids.producer_request_id(acme) == ids.producer_request_id(beta) == "order:1"
    for other in (ids.request_id("local", "cmpl"), "batch_local-abc:c1:2", "kafka:"):  # HTTP, batch-job line ids
        assert ids.producer_request_id(other) == other


def test_a_tenant_holding_the_separator_cannot_scope_ids():
    with pytest.raises(ValueError, match="must not contain"):
        ids.tenant_scoped_id("a:b", "c")  # else tenant "a" with id "b:c" would share its id

"""labels.py and its use by every service's metrics: made-up model and tenant names never become label values."""

from __future__ import annotations

import re

import pytest

from llmq_api.metrics import ApiMetrics
from llmq_core import metrics, wire
from llmq_core.labels import OTHER, LabelSet, configured_tenants
from llmq_core.settings import Settings

T0 = 1_700_000_000_000
INVENTED = [f"made-up-{i}" for i in range(500)]


def label_values(m, label: str) -> set[str]:
    return set(re.findall(rf'{label}="([^"]*)"', m.render().decode()))


def request(model: str, tenant: str = "t") -> wire.GenerationRequest:
    return wire.GenerationRequest(
        request_id=f"r-{model}",
        model=model,
        tenant_id=tenant,
        traffic_class="deferred",
        prompt="x",
        created_ms=T0,
        deadline_ms=T0 + 1000,
        reply_to=wire.HttpReply(instance_id="p"),
    )


def result(model: str, tenant: str) -> wire.FinalResult:
    return wire.FinalResult(
        request_id=f"r-{model}",
        outcome=wire.Outcome.SUCCEEDED,
        model=model,
        tenant_id=tenant,
        reply_to=wire.HttpReply(instance_id="p"),
        traffic_class="interactive",
        usage=wire.Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5),
    )


def test_catalogue_and_configured_tenants_pass_anything_else_is_other(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {tenant: acme, key: k1}\n  - {tenant: hobby, key_sha256: " + "a" * 64 + "}\n")
    labels = LabelSet.from_settings(Settings(api={"keys_file": str(keys)}, models={"extra": ["my-llama"]}))
    assert [labels.model(m) for m in ("llmq-sim", "llmq-tiny", "my-llama", "gpt-4")] == [
        "llmq-sim",
        "llmq-tiny",
        "my-llama",
        OTHER,
    ]
    assert [labels.tenant(t) for t in ("acme", "hobby", "dev", "dev-free", "mallory")] == [
        "acme",
        "hobby",
        "dev",
        "dev-free",
        OTHER,
    ]
    assert configured_tenants(Settings(api={"keys_file": str(keys), "dev_keys": False})) == {"acme", "hobby"}


def test_an_unreadable_keys_file_is_a_start_error(tmp_path):
    with pytest.raises(ValueError, match="API keys file"):
        configured_tenants(Settings(api={"keys_file": str(tmp_path / "missing.yaml")}))


def test_batcher_metrics_fold_500_made_up_models_into_other():
    m = metrics.BatcherMetrics(LabelSet())
    for model in INVENTED:
        m.consumed(request(model))
        m.answered_request(request(model), "expired")
        m.dispatched(model, "wait", [request(model)], T0 + 10, max_batch=4)
    m.queues([("deferred", model, 1, 1000 + i) for i, model in enumerate(INVENTED)] + [("deferred", "llmq-sim", 2, 50)])
    assert label_values(m, "model") == {OTHER, "llmq-sim"}
    assert (
        m.registry.get_sample_value("llmq_batcher_queue_depth", {"priority_class": "deferred", "model": OTHER}) == 500
    )
    assert (
        m.registry.get_sample_value(
            "llmq_batcher_oldest_queued_age_seconds", {"priority_class": "deferred", "model": OTHER}
        )
        == 1.499
    )
    assert (
        m.registry.get_sample_value("llmq_batcher_requests_total", {"traffic_class": "deferred", "model": OTHER}) == 500
    )


def test_router_metrics_fold_made_up_models_and_tenants_into_other():
    m = metrics.RouterMetrics(LabelSet(tenants=frozenset({"acme"})))
    for i, model in enumerate(INVENTED):
        m.result(result(model, f"tenant-{i}"), first=True)
    m.result(result("llmq-sim", "acme"), first=True)
    assert label_values(m, "model") == {OTHER, "llmq-sim"}
    assert label_values(m, "tenant") == {OTHER, "acme"}
    assert m.registry.get_sample_value("llmq_tenant_prompt_tokens_total", {"tenant": OTHER, "model": OTHER}) == 1000


def test_worker_metrics_carry_the_workers_own_model():
    m = metrics.WorkerMetrics("llmq-sim")
    for model in INVENTED[:50]:
        m.finished(result(model, "t"))
    assert label_values(m, "model") == {"llmq-sim"}


def test_api_metrics_label_only_catalogue_models():
    m = ApiMetrics(lambda: 0, LabelSet(models=frozenset({"llmq-sim"})))
    for model in ["llmq-sim", "announced-by-a-worker", None]:
        m.answered("interactive", model, 200, 0.1, 0.05)
    assert set(re.findall(r'model="([^"]*)"', m.render().decode())) == {"llmq-sim", OTHER, "unknown"}

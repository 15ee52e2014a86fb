"""Settings grouped by owner: old variable names still read (one warning each), each service validating only the
groups it reads, groups read on first use."""

import json
import logging
import re
from pathlib import Path

import pytest

from llmq_api import main as api_main
from llmq_batcher import main as batcher_main
from llmq_core import runtime
from llmq_core import settings as settings_module
from llmq_core.settings import Settings, SettingsError, env_name, load_settings, old_names
from llmq_result_router import main as router_main
from llmq_worker import main as worker_main

ROOT = Path(__file__).resolve().parents[3]
SERVICES = {
    "api": (api_main, ROOT / "services/api/llmq_api"),
    "batcher": (batcher_main, ROOT / "services/batcher/llmq_batcher"),
    "result-router": (router_main, ROOT / "services/result-router/llmq_result_router"),
    "worker": (worker_main, ROOT / "services/worker/llmq_worker"),
}
RENAMED = [
    (old, name, field)
    for name in Settings.GROUPS
    for field, info in Settings.group_class(name).model_fields.items()
    for old in old_names(info)
]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(settings_module, "_WARNED", set())


def _other_value(group: str, field: str) -> tuple[str, object]:
    """An environment value for ``field`` unlike its default, and what it parses to."""
    default = Settings.group_class(group).model_fields[field].default
    if isinstance(default, int):
        return str(default + 1), default + 1
    if isinstance(default, list):
        return '["m"]', ["m"]
    if isinstance(default, dict):
        return '{"m": "t"}', {"m": "t"}
    return "pod-7", "pod-7"


@pytest.mark.parametrize(("old", "group", "field"), RENAMED, ids=[old for old, _, _ in RENAMED])
def test_a_renamed_variable_is_read_under_its_old_name(old, group, field, monkeypatch):
    raw, parsed = _other_value(group, field)
    monkeypatch.setenv(old, raw)
    assert getattr(getattr(Settings(), group), field) == parsed


def test_an_old_name_warns_once_per_process_and_the_new_name_wins(monkeypatch, caplog):
    monkeypatch.setenv("LLMQ_DEFAULT_TIMEOUT_MS", "1234")
    with caplog.at_level(logging.WARNING, "llmq_core.settings"):
        assert Settings().api.interactive_default_timeout_ms == 1234
        assert Settings().api.interactive_default_timeout_ms == 1234  # a second read: no second warning
        monkeypatch.setenv("LLMQ_API_INTERACTIVE_DEFAULT_TIMEOUT_MS", "999")
        assert Settings().api.interactive_default_timeout_ms == 999
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["LLMQ_DEFAULT_TIMEOUT_MS is deprecated: set LLMQ_API_INTERACTIVE_DEFAULT_TIMEOUT_MS instead"]


def test_most_variables_keep_their_names():
    names = set(Settings.variables())
    assert {"LLMQ_REGION", "LLMQ_API_MAX_BODY_BYTES", "LLMQ_KAFKA_BOOTSTRAP_SERVERS", "LLMQ_REDIS_URL"} <= names
    assert {"LLMQ_FILES_URL", "LLMQ_BATCH_MAX_LINES", "LLMQ_METRICS_PORT", "LLMQ_SHUTDOWN_GRACE_S"} <= names
    assert not names & {old for old, _, _ in RENAMED}  # no old name is also a current one


def test_a_group_is_read_when_first_used_and_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("LLMQ_API_MAX_BODY_BYTES", "not-a-number")
    settings = Settings()
    assert settings.worker.heartbeat_interval_ms == 250  # the API group is not read
    with pytest.raises(SettingsError, match="LLMQ_API_MAX_BODY_BYTES"):
        settings.api  # noqa: B018


def test_a_worker_starts_with_a_broken_api_setting_and_an_api_pod_refuses_naming_it(monkeypatch):
    monkeypatch.setenv("LLMQ_API_MAX_BODY_BYTES", str(1 << 30))  # more than one Kafka record could carry
    assert runtime.service_settings(*worker_main.GROUPS).worker.heartbeat_interval_ms == 250
    with pytest.raises(SystemExit, match="LLMQ_API_MAX_BODY_BYTES"):
        runtime.service_settings(*api_main.GROUPS)


def test_the_consumer_services_start_with_a_broken_worker_setting(monkeypatch):
    monkeypatch.setenv("LLMQ_WORKER_ENGINE", "steam")
    for module in (api_main, batcher_main, router_main):
        runtime.service_settings(*module.GROUPS)
    with pytest.raises(SystemExit, match="LLMQ_WORKER_ENGINE"):
        runtime.service_settings(*worker_main.GROUPS)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_each_service_declares_the_groups_its_own_code_reads(service):
    module, package = SERVICES[service]
    read = {
        group
        for path in package.rglob("*.py")
        for group in re.findall(r"\bsettings\.([a-z_]+)\.", path.read_text())
        if group in Settings.GROUPS
    }
    assert read <= set(module.GROUPS), sorted(read - set(module.GROUPS))


def test_load_settings_validates_every_group_by_default(monkeypatch):
    monkeypatch.setenv("LLMQ_DEV_REDIS_MAXMEMORY_BYTES", "0")
    with pytest.raises(SettingsError, match="LLMQ_DEV_REDIS_MAXMEMORY_BYTES"):
        load_settings()
    assert load_settings("region").region.name == "local"


def test_groups_given_as_values_keep_the_environment_for_the_rest(monkeypatch):
    monkeypatch.setenv("LLMQ_API_MAX_IN_FLIGHT", "7")
    settings = Settings(api={"max_body_bytes": 2000})
    assert (settings.api.max_body_bytes, settings.api.max_in_flight) == (2000, 7)
    with pytest.raises(TypeError, match="no group 'apis'"):
        Settings(apis={})


def test_defaults_and_an_explicit_environment_ignore_the_process_environment(monkeypatch):
    monkeypatch.setenv("LLMQ_BATCHER_MAX_QUEUED", "5")
    assert Settings.defaults().batcher.max_queued == 100_000
    assert Settings.from_environ({"LLMQ_REGION": "b"}).batcher.max_queued == 100_000
    assert Settings.from_environ({"LLMQ_REGION": "b"}).region.name == "b"


def test_replace_changes_only_the_named_fields_and_validates_them():
    settings = Settings(kafka={"bootstrap_servers": "k:1"})
    changed = settings.replace(kafka={"topic_replication_factor": 3})
    assert (changed.kafka.bootstrap_servers, changed.kafka.topic_replication_factor) == ("k:1", 3)
    assert settings.kafka.topic_replication_factor == 1
    with pytest.raises(ValueError, match="topic_replication_factor"):
        settings.replace(kafka={"topic_replication_factor": 0})


def test_every_field_has_a_description_and_a_variable_of_its_group():
    for name in Settings.GROUPS:
        group = Settings.group_class(name)
        for field, info in group.model_fields.items():
            assert info.description, f"{name}.{field} has no description"
            assert env_name(group, field).startswith("LLMQ_")


def test_json_settings_parse_from_the_environment(monkeypatch):
    monkeypatch.setenv("LLMQ_KAFKA_INGRESS", json.dumps({"acme-svc": {"tenant_id": "acme"}}))
    monkeypatch.setenv("LLMQ_BATCHER_TENANT_WEIGHTS", '{"acme": 2}')
    settings = Settings()
    assert settings.kafka.ingress["acme-svc"].tenant_id == "acme"
    assert settings.batcher.max_wait_ms() == {"interactive": 0, "near_interactive": 50, "deferred": 500}
    assert settings.batcher.tenant_weights == {"acme": 2.0}

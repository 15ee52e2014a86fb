"""auth.py: API keys -> tenant, tier, classes and limits; 401 for anyone else; x-llmq-class among allowed classes."""

import hashlib
import json
from pathlib import Path

import pytest

from llmq_api.auth import DEV_FREE_KEY, DEV_KEY, KeyEntry, KeyStore, Principal, load_keys_file
from llmq_api.errors import ApiError
from llmq_core.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "keys.example.yaml"


def refused(store: KeyStore, authorization: str | None) -> ApiError:
    with pytest.raises(ApiError) as info:
        store.authenticate(authorization)
    return info.value


def test_dev_keys_work_out_of_the_box():
    store = KeyStore.from_settings(Settings())
    paid = store.authenticate(f"Bearer {DEV_KEY}")
    free = store.authenticate(f"bearer  {DEV_FREE_KEY} ")
    assert (paid.tenant_id, paid.tier, paid.classes) == ("dev", "paid", ("interactive", "near_interactive", "deferred"))
    assert (free.tenant_id, free.tier) == ("dev-free", "free")
    assert paid.requests_per_min == paid.tokens_per_min == 0


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", "Basic llmq-dev-key", "Bearer nope", "llmq-dev-key", "Bearer llmq-dev-key-2"],
)
def test_missing_or_unknown_keys_are_401(authorization):
    error = refused(KeyStore.from_settings(Settings()), authorization)
    assert error.status == 401 and error.code == "invalid_api_key" and error.headers["www-authenticate"] == "Bearer"
    assert "llmq-dev-key" not in error.message


def test_dev_keys_can_be_switched_off():
    assert refused(KeyStore.from_settings(Settings(api={"dev_keys": False})), f"Bearer {DEV_KEY}").status == 401


def test_example_keys_file_loads_with_plain_and_hashed_keys():
    store = KeyStore.from_settings(Settings(api={"keys_file": str(EXAMPLE), "dev_keys": False}))
    acme = store.authenticate("Bearer sk-acme-example-change-me")
    assert (acme.tenant_id, acme.requests_per_min, acme.tokens_per_min) == ("acme", 600, 2_000_000)
    batch = store.authenticate("Bearer sk-acme-batch-example-change-me")  # listed by its SHA-256 only
    assert batch.tenant_id == "acme-batch" and batch.classes == ("deferred",)
    hobby = store.authenticate("Bearer sk-hobbyist-example-change-me")
    assert hobby.tier == "free" and hobby.classes == ("interactive",)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("keys: [{tenant: a}]", "exactly one of key"),
        ("keys: [{tenant: a, key: k, key_sha256: '" + "0" * 64 + "'}]", "exactly one of key"),
        ("keys: [{tenant: a, key: k, classes: []}]", "at least one class"),
        ("keys: [{tenant: a, key: k, classes: [urgent]}]", "classes"),
        ("keys: [{tenant: a, key: k, tier: gold}]", "tier"),
        ("keys: [{tenant: a, key: k, requests_per_min: -1}]", "requests_per_min"),
        ("keys: [{tenant: a, key_sha256: abc}]", "key_sha256"),
        ("keys: [{tenant: a, key: k, rpm: 3}]", "rpm"),
        ("keys: {tenant: a}", "array"),
        ("keys: [", "while parsing"),
    ],
)
def test_bad_keys_files_are_refused_with_the_reason(tmp_path, text, problem):
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_keys_file(path)


def test_json_keys_file_and_missing_file(tmp_path):
    path = tmp_path / "keys.json"
    digest = hashlib.sha256(b"secret").hexdigest().upper()
    entry = {"tenant": "t", "key_sha256": digest, "classes": ["deferred", "interactive"]}
    path.write_text(json.dumps({"keys": [entry]}))
    store = KeyStore({})
    store.add(load_keys_file(path))
    assert store.authenticate("Bearer secret").classes == ("interactive", "deferred")  # priority order
    with pytest.raises(ValueError, match="nope.yaml"):
        KeyStore.from_settings(Settings(api={"keys_file": str(tmp_path / "nope.yaml")}))


def test_pick_class_defaults_to_the_first_allowed_and_refuses_others():
    principal = Principal(tenant_id="t", classes=("near_interactive", "deferred"))
    assert principal.pick_class(None) == "near_interactive"
    assert principal.pick_class(" Deferred ") == "deferred"
    forbidden = pytest.raises(ApiError)
    with forbidden as info:
        principal.pick_class("interactive")
    assert (info.value.status, info.value.code, info.value.param) == (403, "class_not_allowed", "x-llmq-class")
    with pytest.raises(ApiError) as info:
        principal.pick_class("urgent")
    assert (info.value.status, info.value.param) == (400, "x-llmq-class")


def test_entries_map_onto_principals():
    store = KeyStore({})
    store.add([KeyEntry(tenant="t", key="k", tier="free", classes=["deferred"], requests_per_min=5, tokens_per_min=7)])
    assert store.authenticate("Bearer k") == Principal(
        tenant_id="t", tier="free", classes=("deferred",), requests_per_min=5, tokens_per_min=7
    )


def test_a_key_named_twice_by_digest_refuses_to_start(tmp_path):
    path = tmp_path / "keys.yaml"
    digest = hashlib.sha256(b"sk-shared").hexdigest()
    path.write_text(f"keys: [{{tenant: a, key: sk-shared}}, {{tenant: b, key_sha256: '{digest.upper()}'}}]")
    with pytest.raises(ValueError, match=r"keys\[1\] \(tenant 'b'\) names a key already given by keys\[0\]"):
        KeyStore.from_settings(Settings(api={"keys_file": str(path), "dev_keys": False}))
    path.write_text(f"keys: [{{tenant: a, key: {DEV_KEY}}}]")  # the dev key, while the dev keys are on
    with pytest.raises(ValueError, match="dev keys"):
        KeyStore.from_settings(Settings(api={"keys_file": str(path)}))
    assert (
        KeyStore.from_settings(Settings(api={"keys_file": str(path), "dev_keys": False})).tenant_of(f"Bearer {DEV_KEY}")
        == "a"
    )

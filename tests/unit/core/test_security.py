"""The transport-security pieces that are pure: client options from settings, the role ACL tables, the secure broker's
properties, the dev stack's secrets. Against real Kafka and Redis: tests/system/test_security.py."""

from __future__ import annotations

import json
import re
import ssl
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmq_cli.devsecrets import DevSecrets
from llmq_cli.devstack import DevStack, StackConfig
from llmq_cli.kafka_dist import secure_server_properties
from llmq_cli.main import app
from llmq_core import constants, security
from llmq_core.kafka import client_options
from llmq_core.redis_client import connection_options
from llmq_core.security import GROUP, READ, TOPIC, WRITE, kafka_acls, redis_acl_file
from llmq_core.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_plaintext_client_options_are_only_the_bootstrap_servers():
    assert client_options(Settings(kafka={"bootstrap_servers": "k:1"})) == {"bootstrap_servers": "k:1"}


def test_sasl_ssl_options_read_the_password_file(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    options = client_options(
        Settings(
            kafka={
                "security_protocol": "SASL_SSL",
                "sasl_username": "api",
                "sasl_password": "inline",
                "sasl_password_file": str(secret),
            },
        )
    )
    assert options["security_protocol"] == "SASL_SSL"
    assert (options["sasl_mechanism"], options["sasl_plain_username"]) == ("SCRAM-SHA-512", "api")
    assert options["sasl_plain_password"] == "from-file"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_ssl_options_carry_no_sasl_credentials():
    options = client_options(Settings(kafka={"security_protocol": "SSL", "sasl_password": "unused"}))
    assert options["security_protocol"] == "SSL"
    assert not any(key.startswith("sasl") for key in options)


def test_redis_options_from_settings(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret")
    assert connection_options(Settings()) == {}
    options = connection_options(
        Settings(redis={"username": "worker", "password_file": str(secret), "ssl_cafile": "/ca.pem"})
    )
    assert options == {"username": "worker", "password": "s3cret", "ssl_ca_certs": "/ca.pem"}


def rows(acls, principal):
    return {(a.resource, a.name, a.operation, a.prefixed) for a in acls if a.principal == principal}


def covers(acl, topic: str) -> bool:
    return acl.resource == TOPIC and (topic == acl.name or (acl.prefixed and topic.startswith(acl.name)))


def test_each_role_writes_only_its_own_topics():
    acls = kafka_acls(reply_topic_prefixes=("team.",), ingress_principals=("team-a",))
    writes = {p: {(n, pre) for r, n, op, pre in rows(acls, p) if op == WRITE} for p in {a.principal for a in acls}}
    assert writes[security.ROLE_API] == {
        (constants.TOPIC_REQUESTS_PREFIX, True),
        (constants.job_topic("specs"), False),  # a batch job's create and cancel
        (constants.job_topic("lines"), False),
    }
    assert writes[security.ROLE_WORKER] == {(constants.TOPIC_RESULTS, False), (constants.TOPIC_DEAD_LETTERS, False)}
    assert writes[security.ROLE_ROUTER] == {
        (constants.requests_topic(constants.DEFERRED), False),
        (constants.TOPIC_DEAD_LETTERS, False),
        (constants.TOPIC_JOBS_PREFIX, True),
        ("team.", True),
    }
    assert (constants.TOPIC_BATCHES, False) in writes[security.ROLE_BATCHER]
    assert writes["team-a"] == {(constants.ingress_topic("team-a"), False)}
    assert security.ROLE_ADMIN not in writes and security.ROLE_MM2 not in writes  # super user; reserved


def test_only_routers_write_claims_and_settled_results_of_batch_jobs():
    """Issue 34, item 2: as `api`, one record on llmq.jobs.owners froze another tenant's job, and a forged
    llmq.jobs.ledger record would be trusted by a rebuild: API pods write only what a create and a cancel need."""
    acls = kafka_acls(reply_topic_prefixes=("team.",), ingress_principals=("team-a",), peer_regions=("b",))
    for kind in ("owners", "ledger"):
        writers = {a.principal for a in acls if a.operation == WRITE and covers(a, constants.job_topic(kind))}
        assert writers == {security.ROLE_ROUTER}, kind
    api = [a for a in acls if a.principal == security.ROLE_API and a.operation == WRITE]
    assert all(any(covers(a, constants.job_topic(k)) for a in api) for k in ("specs", "lines"))


def test_each_ingress_principal_reads_its_own_reply_topics_in_its_own_group_and_the_router_writes_them():
    """Issue 34, item 5: a secure stack's router had no ACL on any reply topic (every Kafka-direct answer
    dead-lettered) and no ingress principal could read one."""
    acls = kafka_acls(("team.",), ("team-a", "team-b"), ingress_reply_prefixes={"team-b": ("beta.",)})
    assert rows(acls, "team-a") >= {
        (TOPIC, "team.", READ, True),
        (GROUP, constants.ingress_group("team-a"), READ, False),
    }
    assert rows(acls, "team-b") >= {(TOPIC, "beta.", READ, True), (GROUP, "team-b", READ, False)}
    assert (TOPIC, "team.", READ, True) not in rows(acls, "team-b")  # bound to its own prefix
    router_writes = {(n, pre) for r, n, op, pre in rows(acls, security.ROLE_ROUTER) if op == WRITE}
    assert {("team.", True), ("beta.", True)} <= router_writes


def test_only_consumers_read_and_each_in_its_own_group():
    acls = kafka_acls(ingress_principals=("team-a",))
    reads = {(a.principal, a.resource, a.name) for a in acls if a.operation == READ}
    assert {p for p, *_ in reads} == {security.ROLE_BATCHER, security.ROLE_WORKER, security.ROLE_ROUTER, "team-a"}
    assert (security.ROLE_ROUTER, TOPIC, constants.TOPIC_RESULTS) in reads
    assert (security.ROLE_WORKER, TOPIC, constants.TOPIC_BATCHES) in reads
    assert (security.ROLE_BATCHER, TOPIC, constants.TOPIC_INGRESS_PREFIX) in reads
    groups = {(p, n) for p, r, n in reads if r == GROUP}
    assert groups == {
        (security.ROLE_BATCHER, constants.GROUP_BATCHER),
        (security.ROLE_WORKER, constants.GROUP_WORKER_PREFIX),
        (security.ROLE_ROUTER, constants.GROUP_RESULT_ROUTER),
        (security.ROLE_ROUTER, constants.GROUP_PEER_RESULTS),  # the peer regions' mirrored results
        ("team-a", "team-a"),  # a Kafka-direct producer reading its replies
    }
    assert constants.worker_group(7).startswith(constants.GROUP_WORKER_PREFIX)


# Topics each service's code produces to or consumes from (its ``names.<x>`` attributes and constants), found by
# reading it; test_the_table_covers_what_each_service_uses checks the code still names only these.
REQUESTS, DEFERRED = constants.TOPIC_REQUESTS_PREFIX, constants.requests_topic(constants.DEFERRED)
RESULTS, BATCHES, DEAD = constants.TOPIC_RESULTS, constants.TOPIC_BATCHES, constants.TOPIC_DEAD_LETTERS
SERVICE_TOPICS = {
    "services/api": (security.ROLE_API, {"request_topic": REQUESTS}),  # names.request_topic(any class)
    "services/worker": (
        security.ROLE_WORKER,
        {"batches_topic": BATCHES, "results_topic": RESULTS, "dead_letters_topic": DEAD, "TOPIC_RESULTS": RESULTS},
    ),
    "services/batcher": (
        security.ROLE_BATCHER,
        {
            "request_topics": REQUESTS,
            "deferred_topic": DEFERRED,
            "batches_topic": BATCHES,
            "results_topic": RESULTS,
            "dead_letters_topic": DEAD,
            "TOPIC_RESULTS": RESULTS,
        },
    ),
    "services/result-router": (
        security.ROLE_ROUTER,
        {"TOPIC_RESULTS": RESULTS, "requests_topic": DEFERRED, "dead_letters_topic": DEAD},  # batch-job lines
    ),
}
TOPIC_USE = re.compile(r"names\.(\w+_topics?)\b|\b(TOPIC_RESULTS|TOPIC_BATCHES|TOPIC_DEAD_LETTERS|requests_topic)\b")


@pytest.mark.parametrize("folder", sorted(SERVICE_TOPICS))
def test_the_table_covers_what_each_service_uses(folder):
    role, expected = SERVICE_TOPICS[folder]
    used = {m.group(1) or m.group(2) for p in (ROOT / folder).rglob("*.py") for m in TOPIC_USE.finditer(p.read_text())}
    assert used == set(expected)  # a new topic use: add its ACL row to llmq_core.security, then here
    granted = [(a.name, a.prefixed) for a in kafka_acls() if a.principal == role and a.operation in (READ, WRITE)]
    for topic in expected.values():
        assert any(topic == g or (prefixed and topic.startswith(g)) for g, prefixed in granted), (role, topic)


@pytest.mark.parametrize("folder", sorted(SERVICE_TOPICS))
def test_no_service_creates_topics_or_acls_outside_plaintext_mode(folder):
    """Topic creation is the admin's: a service calls ensure_topics only behind a PLAINTEXT check."""
    for path in (ROOT / folder).rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"ensure_topics\(|create_topic\(|apply_kafka_acls\(", text):
            before = text[max(0, match.start() - 200) : match.start()]
            assert 'kafka.security_protocol == "PLAINTEXT"' in before, f"{path}: {match.group()}"


def test_every_operation_has_describe_configs_for_the_start_check():
    acls = kafka_acls()
    topics = {(a.principal, a.name) for a in acls if a.resource == TOPIC}
    described = {(a.principal, a.name) for a in acls if a.operation == security.DESCRIBE_CONFIGS}
    assert topics == described


def redis_users(text: str) -> dict[str, str]:
    return {line.split()[1]: line for line in text.splitlines()}


def test_redis_acl_file_keeps_reply_publishers_apart():
    passwords = {role: f"pw-{role}" for role in security.ROLES}
    users = redis_users(redis_acl_file(passwords))
    assert users["default"] == "user default off"
    replies = "&" + constants.REDIS_REPLIES_PREFIX + "*"
    publishers = {name for name, line in users.items() if "(+publish" in line and replies in line.split("(+publish")[1]}
    assert publishers == {security.ROLE_WORKER, security.ROLE_BATCHER, security.ROLE_ROUTER}
    api_root, api_selector = users[security.ROLE_API].split("(")
    assert replies in api_root and "+subscribe" in api_root and "+publish" not in api_root
    assert replies not in api_selector
    for role in security.REDIS_ROLES:
        assert f">pw-{role} " in users[role] and "-@dangerous" in users[role]


def test_secure_broker_has_no_plaintext_listener_and_an_authorizer(tmp_path):
    text = secure_server_properties(tmp_path, 1, 2, 3, {"keystore": "/k.pem", "ca": "/ca.pem"}, ["admin", "b"])
    props = dict(line.split("=", 1) for line in text.splitlines() if line)
    assert "PLAINTEXT" not in props["listener.security.protocol.map"].replace("SASL_SSL", "")
    assert all("127.0.0.1" in listener for listener in props["listeners"].split(","))
    assert props["auto.create.topics.enable"] == "false"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin;User:b"


def test_dev_secrets_are_private_and_reused(tmp_path):
    secrets = DevSecrets(tmp_path / "secrets")
    secrets.ensure(("team-a",))
    password = secrets.password(security.ROLE_API)
    secrets.ensure(("team-a",))
    assert secrets.password(security.ROLE_API) == password and len(password) == 48
    assert secrets.cert("team-a").exists() and secrets.password("team-a")  # an ingress producer's identity
    assert stat.S_IMODE(secrets.folder.stat().st_mode) == 0o700
    for private in [secrets.password_file(security.ROLE_WORKER), secrets.key("redis"), secrets.broker_keystore]:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_secure_stack_gives_each_service_its_own_role(tmp_path):
    cfg = StackConfig(state_dir=tmp_path, secure=True)
    env = cfg.env(security.ROLE_WORKER)
    assert env["LLMQ_KAFKA_SASL_USERNAME"] == env["LLMQ_REDIS_USERNAME"] == security.ROLE_WORKER
    assert env["LLMQ_REDIS_URL"].startswith("rediss://") and env["LLMQ_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert "LLMQ_KAFKA_SECURITY_PROTOCOL" not in StackConfig(state_dir=tmp_path).env()


def test_a_secure_dev_stack_takes_reply_prefixes_from_the_settings_and_grants_them(monkeypatch, tmp_path):
    """Issue 34, item 5: StackConfig's reply prefixes defaulted to none whatever LLMQ_KAFKA_REPLY_TOPIC_PREFIXES said,
    so `llmq dev up --secure` gave the router no ACL on any reply topic."""
    monkeypatch.setenv("LLMQ_KAFKA_REPLY_TOPIC_PREFIXES", "replies.")
    monkeypatch.setenv("LLMQ_KAFKA_INGRESS", json.dumps({"acme-svc": {"tenant_id": "acme"}}))
    cfg = StackConfig(state_dir=tmp_path, secure=True, peer_regions=("b",))
    assert cfg.reply_topic_prefixes == ("replies.",) and cfg.ingress_principals == ("acme-svc",)
    acls = {(a.principal, a.resource, a.name, a.operation) for a in cfg.kafka_acls()}
    assert (security.ROLE_ROUTER, TOPIC, "replies.", WRITE) in acls
    assert {("acme-svc", TOPIC, "replies.acme-svc.", READ), ("acme-svc", GROUP, "acme-svc", READ)} <= acls
    assert cfg.env()["LLMQ_REGION_PEERS"] == "b"  # whose claims on batch jobs count there


def test_dev_up_secure_flag_makes_a_secure_stack(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(DevStack, "up", lambda self, **_: seen.append(self.cfg.secure))
    for args in (["--secure"], []):
        result = CliRunner().invoke(app, ["dev", "up", "--state-dir", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
    assert seen == [True, False]


def test_mirror_maker_2_reads_the_mirrored_topics_and_writes_only_its_own_and_the_peers_remote_ones():
    acls = [a for a in kafka_acls(peer_regions=("b",)) if a.principal == security.ROLE_MM2]
    topic = {(a.name, a.prefixed, a.operation) for a in acls if a.resource == TOPIC}
    assert (constants.TOPIC_JOBS_PREFIX, True, READ) in topic and (constants.TOPIC_RESULTS, False, READ) in topic
    writes = {(name, prefixed) for name, prefixed, op in topic if op == WRITE}
    assert writes == {("b.", True), (security.MM2_TOPIC_PREFIX, True), (security.MM2_HEARTBEATS_TOPIC, False)}
    assert not any(name.startswith(constants.TOPIC_PREFIX) for name, _ in writes)  # never llmq's own topics
    groups = {(a.name, a.operation) for a in acls if a.resource == GROUP}
    assert groups == {("llmq-", security.DESCRIBE), ("b-mm2", READ)}
    router = {(a.name, a.operation) for a in kafka_acls(peer_regions=("b",)) if a.principal == security.ROLE_ROUTER}
    assert ("b.llmq.results", READ) in router
    assert ("b.llmq.jobs.owners", READ) in router  # fencing of batch jobs
    assert not [a for a in kafka_acls() if a.principal == security.ROLE_MM2]  # no peers: no rights at all

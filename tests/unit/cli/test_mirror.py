"""MirrorMaker 2's properties (generated from code) and a region's stack: its ports, ids and processes."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from llmq_cli import mirror
from llmq_cli.devstack import DevStack, ProcSpec, StackConfig, service_specs
from llmq_cli.main import app
from llmq_core import constants

A = mirror.MirrorCluster("a", "127.0.0.1:26100")
B = mirror.MirrorCluster("b", "127.0.0.1:26200")


def parsed(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines())


def test_both_flows_mirror_the_job_topics_and_results_under_the_default_policy():
    props = parsed(mirror.mirror_properties(A, B))
    assert props["clusters"] == "a, b"
    assert (props["a.bootstrap.servers"], props["b.bootstrap.servers"]) == (A.bootstrap, B.bootstrap)
    assert props["a->b.enabled"] == props["b->a.enabled"] == "true"
    assert props["replication.policy.class"].endswith(".DefaultReplicationPolicy")
    assert props["emit.offset-syncs.enabled"] == props["emit.checkpoints.enabled"] == "true"
    pattern = re.compile(props["a->b.topics"])
    mirrored = ["llmq.jobs.ledger", "llmq.jobs.specs", constants.TOPIC_RESULTS]
    kept = [*constants.REQUEST_TOPICS, constants.TOPIC_BATCHES, "b.llmq.jobs.ledger", "llmq.resultsx", "llmq.jobsx"]
    assert all(pattern.fullmatch(t) for t in mirrored) and not any(pattern.fullmatch(t) for t in kept)
    assert props["b->a.topics"] == props["a->b.topics"]
    assert int(props["a.producer.max.request.size"]) == constants.KAFKA_MAX_MESSAGE_BYTES


def test_intervals_are_the_defaults_unless_a_test_shortens_them():
    production = parsed(mirror.mirror_properties(A, B))
    assert [production[f"{n}.interval.seconds"] for n in ("refresh.topics", "refresh.groups", "emit.checkpoints")] == [
        "600",
        "600",
        "60",
    ]
    test = parsed(mirror.mirror_properties(A, B, mirror.MirrorOptions(intervals_s=dict(mirror.TEST_INTERVALS_S))))
    assert test["refresh.topics.interval.seconds"] == test["emit.checkpoints.interval.seconds"] == "5"
    assert all(test[name] == "1" for name in test if name.endswith("replication.factor"))


def test_a_secure_cluster_is_reached_as_the_mm2_principal_over_sasl_ssl():
    secure = mirror.MirrorCluster("a", "127.0.0.1:26100", sasl_password="pw", ca=Path("/ca.pem"))
    props = parsed(mirror.mirror_properties(secure, B))
    assert props["a.security.protocol"] == "SASL_SSL" and props["a.sasl.mechanism"] == "SCRAM-SHA-512"
    assert 'username="mm2" password="pw"' in props["a.sasl.jaas.config"]
    assert props["a.ssl.truststore.location"] == "/ca.pem"
    assert "b.security.protocol" not in props  # a PLAINTEXT peer stays plaintext


def test_the_command_line_names_the_target_after_the_properties_file():
    argv = mirror.mirror_argv(Path("/libs"), Path("/m.properties"), Path("/log4j2.properties"), "b")
    assert argv[-4:] == [mirror.MAIN_CLASS, "/m.properties", "--clusters", "b"]


def test_a_region_stack_takes_its_ports_from_its_base_and_names_every_process_by_its_region(tmp_path):
    cfg = StackConfig.for_region("eu-1", 26100, tmp_path)
    assert (cfg.state_dir, cfg.kafka_port, cfg.redis_port, cfg.api_ports) == (
        tmp_path / "eu-1",
        26100,
        26105,
        (26110, 26111),
    )
    assert cfg.env()["LLMQ_REGION"] == "eu-1"
    for spec in service_specs(cfg):
        flag = "--worker-id" if spec.kind == "worker" else "--instance-id"
        assert spec.argv[spec.argv.index(flag) + 1].startswith("eu-1-")
        assert not spec.alive or spec.alive.split(":")[-1].startswith("eu-1-")
    ports = [cfg.kafka_port, cfg.kafka_port + 1, cfg.kafka_tls_port, cfg.redis_port, *cfg.api_ports]
    ports += [spec.metrics_port for spec in service_specs(cfg)]
    assert len(set(ports)) == len(ports) and max(ports) < 26100 + 100  # the next region's base is 100 above


def test_dev_up_with_a_region_runs_that_regions_stack(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(DevStack, "up", lambda self, **_: seen.append(self.cfg))
    result = CliRunner().invoke(
        app, ["dev", "up", "--state-dir", str(tmp_path), "--region", "b", "--port-base", "26200"]
    )
    assert result.exit_code == 0, result.output
    assert (seen[0].region, seen[0].kafka_port, seen[0].state_dir) == ("b", 26200, tmp_path / "b")
    refused = CliRunner().invoke(app, ["dev", "up", "--state-dir", str(tmp_path), "--region", "B"])
    assert refused.exit_code == 2 and "region" in refused.output


def test_losing_a_region_sigkills_every_process_it_started_and_only_those(tmp_path):
    stack = DevStack(StackConfig.for_region("a", 26100, tmp_path))
    for folder in (stack.pids, stack.logs):
        folder.mkdir(parents=True)
    for name in ("kafka", "mirror-b"):
        stack._spawn(ProcSpec(name=name, kind=name.split("-")[0], argv=["sleep", "60"], marker="sleep"))
    pids = [row["pid"] for row in stack.status()]
    assert len(pids) == 2
    assert sorted(stack.kill()) == ["kafka", "mirror-b"]
    assert stack.status() == [] and stack.kill() == []
    for pid in pids:  # gone (or a zombie until this test process reaps it): nothing runs
        assert (
            not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        )


def test_process_names_stay_the_same_in_every_region(tmp_path):
    names = [spec.name for spec in service_specs(StackConfig.for_region("eu-1", 26100, tmp_path))]
    assert names == [spec.name for spec in service_specs(StackConfig(state_dir=tmp_path))]
    assert "worker-sim-0" in names and "api-0" in names

"""``llmq dev up --batchers N --routers N``: N processes of each, unique instance ids, /metrics ports that never
collide and stay where one-of-each stacks had them."""

from __future__ import annotations

import dataclasses

from typer.testing import CliRunner

from llmq_cli.devstack import DevStack, StackConfig, service_specs
from llmq_cli.main import app


def _flag(spec, flag: str) -> str:
    return spec.argv[spec.argv.index(flag) + 1]


def test_n_batchers_and_routers_each_get_a_unique_instance_id_alive_key_and_metrics_port():
    cfg = StackConfig(api_ports=(8000, 8001), batchers=3, routers=2, smollm2_workers=1)
    specs = service_specs(cfg)
    by_kind = {kind: [s for s in specs if s.kind == kind] for kind in ("batcher", "result-router")}
    assert [s.name for s in by_kind["batcher"]] == ["batcher", "batcher-1", "batcher-2"]
    assert [_flag(s, "--instance-id") for s in by_kind["batcher"]] == [
        cfg.instance_id(f"batcher-{i}") for i in range(3)
    ]
    assert [s.name for s in by_kind["result-router"]] == ["result-router", "result-router-1"]
    alive = [s.alive for s in specs if s.kind != "api"]  # API pods answer /readyz instead
    assert len(set(alive)) == len(alive) and all(alive)
    ports = [s.metrics_port for s in specs] + list(cfg.api_ports)
    assert len(set(ports)) == len(ports) and all(ports)
    assert all(int(_flag(s, "--metrics-port")) == s.metrics_port for s in specs)


def test_the_first_of_each_keeps_its_ports_and_growing_a_stack_moves_no_running_process():
    one = {s.name: s.metrics_port for s in service_specs(StackConfig())}
    base = StackConfig().metrics_base_port
    assert (one["result-router"], one["batcher"]) == (base, base + 1)
    grown = {s.name: s.metrics_port for s in service_specs(StackConfig(batchers=4, routers=3))}
    assert {name: grown[name] for name in one} == one
    more = {s.name: s.metrics_port for s in service_specs(StackConfig(batchers=5, routers=3))}
    assert {name: more[name] for name in grown} == grown


def test_without_api_pods_no_process_serves_metrics():
    assert {s.metrics_port for s in service_specs(StackConfig(api_ports=(), batchers=3, routers=3))} == {0}


def test_dev_up_passes_the_counts_and_status_lists_every_replica(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(DevStack, "up", lambda self, **_: seen.append(self.cfg))
    result = CliRunner().invoke(app, ["dev", "up", "--state-dir", str(tmp_path), "--batchers", "3", "--routers", "2"])
    assert result.exit_code == 0, result.output
    assert (seen[0].batchers, seen[0].routers) == (3, 2)
    refused = CliRunner().invoke(app, ["dev", "up", "--state-dir", str(tmp_path), "--batchers", "0"])
    assert refused.exit_code == 2
    stack = DevStack(dataclasses.replace(seen[0], redis_port=1))  # nothing answers there: health from pids only
    for folder in (stack.pids, stack.logs):
        folder.mkdir(parents=True, exist_ok=True)
    for spec in service_specs(stack.cfg):
        if spec.kind in ("batcher", "result-router"):
            stack._spawn(dataclasses.replace(spec, argv=["sleep", "60"], marker="sleep"))
    try:
        rows = {row["name"]: row for row in stack.status()}
        assert sorted(rows) == ["batcher", "batcher-1", "batcher-2", "result-router", "result-router-1"]
        assert all(row["health"] == "starting" for row in rows.values())
    finally:
        assert sorted(stack.down(timeout_s=5)) == sorted(rows)

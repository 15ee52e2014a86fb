"""``llmq capacity``'s fleet plan (issue 28, item 7): processes per kind from CPU ms per request, the partitions that
cap each kind of consumer, the brokers' CPU and bytes, the CPU profile read from ``llmq bench scale``'s JSON, and the
command's refusals of input that makes no plan."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmq_bench.capacity import (
    CONSUMED_BY,
    DEFAULT_CPU_PROFILE,
    PROCESS_KINDS,
    cpu_profile,
    fleet_plan,
    kafka_traffic,
    partition_caps,
    record_bytes,
)
from llmq_cli.main import app

REPO = Path(__file__).resolve().parents[3]
CPU_MS = {"api": 2.5, "batcher": 0.8, "worker": 0.6, "result-router": 0.4, "kafka": 1.2, "redis": 0.15}
REQUESTS, BATCHES, RESULTS = CONSUMED_BY


def test_each_kind_gets_the_processes_its_cores_at_peak_need_with_headroom():
    plan = fleet_plan(40_000, CPU_MS, replicas=225, headroom=0.3, replication_factor=1)
    api = plan["processes"]["api"]
    assert api["cores_at_peak"] == 100.0  # 40,000 req/s x 2.5 ms
    assert api["requests_per_s_per_core"] == 400.0
    assert api["processes"] == math.ceil(100 / 0.7)
    assert plan["processes"]["batcher"]["processes"] == math.ceil(32 / 0.7)
    assert plan["processes"]["kafka"]["processes"] == math.ceil(48 / (8 * 0.7))  # eight cores per broker
    assert plan["workers"] == {"replicas": 225, "cpu_ms_per_request": 0.6, "cores_per_worker_at_peak": 0.107}


def test_a_light_load_still_runs_one_process_of_each_kind_and_as_many_brokers_as_replicas():
    plan = fleet_plan(10, CPU_MS, replicas=1, replication_factor=3)
    assert {kind: entry["processes"] for kind, entry in plan["processes"].items()} == {
        "api": 1,
        "batcher": 1,
        "result-router": 1,
        "redis": 1,
        "kafka": 3,
    }
    assert plan["one_redis_enough"]


def test_the_brokers_cpu_counts_every_replica_of_a_record():
    one = fleet_plan(40_000, CPU_MS, replicas=225, replication_factor=1)["processes"]["kafka"]
    three = fleet_plan(40_000, CPU_MS, replicas=225, replication_factor=3)["processes"]["kafka"]
    assert three["cores_at_peak"] == pytest.approx(3 * one["cores_at_peak"])
    assert (three["cpu_ms_per_request"], three["replication_factor"]) == (3.6, 3)


def test_more_redis_work_than_one_command_thread_is_said():
    assert not fleet_plan(40_000, CPU_MS, replicas=225)["one_redis_enough"]  # 6 cores of Redis at peak


def test_the_request_partitions_cap_the_batchers_and_the_others_their_consumers():
    caps = partition_caps({"batcher": 46, "worker": 225, "result-router": 3}, {REQUESTS: 4, BATCHES: 256, RESULTS: 4})
    by_topic = {cap["topic"]: cap for cap in caps}
    assert by_topic[REQUESTS] == {
        "topic": REQUESTS,
        "consumer": "batcher",
        "setting": "LLMQ_KAFKA_REQUEST_TOPIC_PARTITIONS",
        "partitions_needed": 46,
        "partitions_deployed": 4,
        "consumers_usable": 4,
        "capped": True,
    }
    assert not by_topic[BATCHES]["capped"] and by_topic[BATCHES]["consumers_usable"] == 225
    assert not by_topic[RESULTS]["capped"] and by_topic[RESULTS]["consumers_usable"] == 3


def test_without_deployed_partitions_the_plan_gives_each_consumer_one():
    plan = fleet_plan(40_000, CPU_MS, replicas=225)
    assert not any(cap["capped"] for cap in plan["partitions"])
    assert [cap["partitions_needed"] for cap in plan["partitions"]] == [
        plan["processes"]["batcher"]["processes"],
        225,
        plan["processes"]["result-router"]["processes"],
    ]


def test_records_grow_by_the_prompt_and_the_completion_and_a_batch_carries_its_requests():
    small, large = record_bytes(2000, 300, 64), record_bytes(3000, 500, 64)  # alike in msgpack's length headers
    assert large["request"] - small["request"] == 1000
    assert large["result"] - small["result"] == 200
    assert small["request"] < small["batch_per_request"] < small["request"] + 5  # the batch's own fields, shared


def test_kafka_traffic_counts_replicas_and_every_batcher_fetching_every_result():
    record = {"request": 2000, "batch_per_request": 2010, "result": 700}
    traffic = kafka_traffic(1000, record, replication_factor=3, batchers=10)
    assert traffic["produced_bytes_per_s"] == 1000 * 4710
    assert traffic["replicated_bytes_per_s"] == 2 * 1000 * 4710
    assert traffic["fetched_bytes_per_s"] == 1000 * (2000 + 2010 + 700 * 11)
    assert "kafka_traffic" in fleet_plan(1000, CPU_MS, replicas=4, record=record)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"cpu": {k: v for k, v in CPU_MS.items() if k != "redis"}}, "no figure for redis"),
        ({"cpu": CPU_MS | {"api": -1.0}}, "must be >= 0: api -1.0"),
        ({"rps": 0}, "a peak > 0"),
        ({"replicas": 0}, "at least one replica"),
        ({"headroom": 1.0}, "0 <= h < 1"),
        ({"broker_cores": 0}, "--broker-cores > 0"),
        ({"replication_factor": 0}, "--replication-factor >= 1"),
    ],
)
def test_input_that_makes_no_plan_is_refused_saying_why(change, problem):
    args = {"rps": 40_000, "cpu": CPU_MS, "replicas": 225} | change
    rps, cpu = args.pop("rps"), args.pop("cpu")
    with pytest.raises(ValueError, match=problem):
        fleet_plan(rps, cpu, **args)


def _run(batchers: int, cpu_ms: dict, requests: int, answered: int, feed: str | None = None) -> dict:
    run = {
        "batchers": batchers,
        "row": {"cpu_ms_per_request": cpu_ms, "batch_fill": 0.15},
        "machine_busy_fraction": 0.5,
    }
    run["report"] = {"offered_rps": requests / 30, "requests": requests, "succeeded": answered}
    return run | ({"feed": feed} if feed else {})


def test_the_profile_is_the_http_run_of_fewest_batchers_with_the_batcher_alone_beside_it():
    runs = [_run(3, CPU_MS | {"batcher": 1.4}, 4500, 4500), _run(1, CPU_MS, 4500, 4490)]
    profile = cpu_profile({"runs": runs}, "p.json")
    assert (profile["batchers"], profile["below_saturation"], profile["cpu_ms_per_request"]) == (1, True, CPU_MS)
    assert (profile["batch_fill"], profile["offered_rps"], profile["batcher_alone_ms_per_request"]) == (0.15, 150, None)
    assert profile["batcher_growth"] == {
        "batchers": [1, 3],
        "cpu_ms_per_request": [0.8, 1.4],
        "ms_per_extra_batcher": 0.3,
    }
    alone = cpu_profile({"runs": [*runs, _run(1, CPU_MS | {"batcher": 1.9}, 4500, 4500, feed="kafka")]}, "p.json")
    assert alone["batcher_alone_ms_per_request"] == 1.9
    assert alone["cpu_ms_per_request"] == CPU_MS  # the plan is for HTTP traffic: its batcher figure stays


def test_a_profile_measured_past_saturation_says_so():
    profile = cpu_profile({"runs": [_run(1, CPU_MS, 11_400, 8657)]}, "p.json")
    assert not profile["below_saturation"] and profile["answered_share"] == 0.7594
    assert profile["batcher_growth"] is None


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"runs": []},
        {"runs": [{"batchers": 1}]},
        {"runs": [_run(1, CPU_MS, 1, 1, "kafka")]},
        {"runs": [_run(1, CPU_MS, 0, 0)]},
    ],
)
def test_a_json_that_is_no_bench_scale_result_is_refused(data):
    with pytest.raises(ValueError, match="not an `llmq bench scale` JSON"):
        cpu_profile(data, "p.json")


@pytest.mark.parametrize("path", [DEFAULT_CPU_PROFILE, "bench/results/scale.json"])
def test_the_committed_profiles_have_every_kind(path):
    profile = cpu_profile(json.loads((REPO / path).read_text()), path)
    assert set(PROCESS_KINDS) <= set(profile["cpu_ms_per_request"])


def _capacity(*args: str):
    return CliRunner().invoke(app, ["capacity", "--no-simulate", *args])


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--prefix-tokens", "10"], "at most --prompt-tokens"),
        (["--prompt-tokens", "100", "--prefix-hit-rate", "0.5"], "needs --prefix-tokens"),
        (["--headroom", "1"], "0 <= h < 1"),
        (["--replication-factor", "0"], "--replication-factor >= 1"),
        (["--prompt-bytes", "-1"], "--prompt-bytes"),
    ],
)
def test_the_command_refuses_bad_flags_as_usage_errors(args, problem, monkeypatch):
    monkeypatch.chdir(REPO)
    result = _capacity(*args)
    assert result.exit_code == 2, result.output
    assert problem in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output


def test_the_command_refuses_a_profile_that_is_not_json(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("not json")
    result = _capacity("--cpu-profile", str(path))
    assert result.exit_code == 2 and "--cpu-profile" in result.output


def test_the_command_plans_the_fleet_from_a_given_profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"runs": [_run(1, CPU_MS, 4500, 4500)]}))
    result = _capacity("--cpu-profile", str(path), "--json")
    report = json.loads(result.output)
    assert report["cpu_profile"]["source"] == str(path)
    assert report["fleet"]["workers"]["replicas"] == report["math"]["replicas_planned"]
    assert [cap["topic"] for cap in report["fleet"]["partitions"]] == list(CONSUMED_BY)

"""``llmq bench scale``'s pure parts with fake inputs (no stack): CPU per request per process kind, a run's row from a
load report, the ratios against one batcher, the goals, the JSON and the printed table."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from llmq_bench import direct_feed, loadgen, scale
from llmq_bench.prompts import CodePrompt
from llmq_cli import bench_cmd
from llmq_cli.main import app
from llmq_core import wire


def planned(key: str) -> loadgen.Planned:
    return loadgen.Planned(
        at_s=0.0, prompt="p", max_tokens=8, traffic_class="interactive", api_key=key, stream=False, base_url="u"
    )


def fake_report(paid_ms: list[float], free_ok: int, free_429: int, paid_429: int = 0, fill_batches: int = 10) -> dict:
    samples = [loadgen.Sample(planned(scale.PAID_KEY), loadgen.OK, ms, end_s=1.0) for ms in paid_ms]
    samples += [loadgen.Sample(planned(scale.PAID_KEY), "429", 5.0, end_s=0.1) for _ in range(paid_429)]
    samples += [loadgen.Sample(planned(scale.FREE_KEY), loadgen.OK, 2000.0, end_s=2.0) for _ in range(free_ok)]
    samples += [loadgen.Sample(planned(scale.FREE_KEY), "429", 5.0, end_s=0.1) for _ in range(free_429)]
    served = len(paid_ms) + free_ok
    return loadgen.summarize(samples, window_s=2.0, slo_ms=1500, batch_delta=(fill_batches, served), max_batch_size=4)


def test_cpu_per_request_sums_a_kinds_processes_and_derives_requests_per_core():
    kinds = {"batcher": "batcher", "batcher-1": "batcher", "api-0": "api", "kafka": "kafka", "gone": "worker"}
    before = {"batcher": 1.0, "batcher-1": 2.0, "api-0": 0.0, "kafka": 5.0, "gone": 1.0}
    after = {"batcher": 1.5, "batcher-1": 2.5, "api-0": 4.0, "kafka": 7.0}  # "gone" exited meanwhile: left out
    cpu = scale.cpu_by_kind(kinds, before, after, answered=1000)
    assert list(cpu) == ["api", "batcher", "kafka"]  # KINDS order
    assert cpu["batcher"] == {"processes": 2, "cpu_s": 1.0, "ms_per_request": 1.0, "requests_per_s_per_core": 1000.0}
    assert cpu["api"]["ms_per_request"] == 4.0 and cpu["api"]["requests_per_s_per_core"] == 250.0
    assert scale.cpu_by_kind(kinds, before, after, answered=0)["api"]["requests_per_s_per_core"] is None


def test_a_row_splits_paid_and_free_and_keeps_goodput_throughput_and_fill():
    report = fake_report(paid_ms=[100.0, 200.0, 1600.0, 400.0], free_ok=2, free_429=3, paid_429=1)
    r = scale.row(1, report, scale.cpu_by_kind({"b": "batcher"}, {"b": 0.0}, {"b": 0.6}, answered=6))
    assert (r["paid_requests"], r["paid_answered"], r["paid_within_slo"], r["paid_429"]) == (5, 4, 3, 1)
    assert (r["paid_p50_ms"], r["paid_p99_ms"]) == (200.0, 1600.0)
    assert (r["free_answered"], r["free_429"], r["free_504"]) == (2, 3, 0)
    assert r["goodput_rps"] == 1.5  # 3 within the SLO over a 2 s window
    assert r["throughput_rps"] == 3.0  # 6 answered, the last at 2 s
    assert r["batch_fill"] == pytest.approx(6 / 10 / 4)
    assert r["cpu_ms_per_request"] == {"batcher": 100.0} and r["requests_per_s_per_core"] == {"batcher": 10.0}


def rows() -> list[dict]:
    cpu = {"batcher": {"ms_per_request": 0.2, "requests_per_s_per_core": 5000.0}}
    more = {"batcher": {"ms_per_request": 0.3, "requests_per_s_per_core": 3333.3}}
    one = scale.row(1, fake_report([100.0] * 10, free_ok=2, free_429=0), cpu)
    three = scale.row(3, fake_report([100.0] * 9 + [2000.0], free_ok=2, free_429=0, fill_batches=20), more)
    return [one, three]


def test_ratios_and_goals_compare_each_count_with_the_first():
    one, three = rows()
    (q,) = scale.ratios([one, three])
    assert (q["batchers"], q["against"]) == (3, 1)
    assert q["paid_p99_ms"] == 20.0 and q["batch_fill"] == 0.5 and q["goodput_rps"] == 0.9
    assert q["cpu_ms_per_request"] == {"batcher": 1.5}
    first, third = scale.goals([one, three])
    assert first == {"batchers": 1, "no_paid_429_or_504": True}
    assert third == {"batchers": 3, "paid_p99": False, "goodput": True, "batch_fill": False, "no_paid_429_or_504": True}
    assert scale.goals([one, one])[1] == {**third, "paid_p99": True, "batch_fill": True, "batchers": 1}


def test_the_json_and_the_table_show_every_run(tmp_path):
    one, three = rows()
    config = scale.ScaleConfig(batchers=(1, 3), output=tmp_path / "scale.json")
    result = scale.result(config, [{"batchers": 1, "row": one}, {"batchers": 3, "row": three}])
    assert json.loads(json.dumps(result))["config"]["batchers"] == [1, 3]
    console = Console(record=True, width=250)
    bench_cmd.print_scale(result, console)
    text = console.export_text()
    assert "paid_p99_ms x20.00" in text and "goals, 3 batcher(s)" in text
    assert "10 / 10" in text and "10 / 9" in text  # paid answered / within the SLO, 1 then 3 batchers


def test_the_command_refuses_a_count_below_one():
    refused = CliRunner().invoke(app, ["bench", "scale", "--batchers", "0,3"])
    assert refused.exit_code == 2 and "--batchers" in refused.output


def test_a_direct_request_is_interactive_paid_and_answered_on_its_reply_topic():
    prompt = CodePrompt(id="m-1", prompt="def f(", max_tokens=12)
    request = direct_feed.direct_request(
        7, prompt, "bench.direct.ab", model="llmq-sim", now_ms=1000, timeout_ms=60_000, run_id="ab"
    )
    assert (request.request_id, request.traffic_class, request.tier) == ("direct-ab-7", "interactive", "paid")
    assert (request.prompt, request.sampling.max_tokens, request.deadline_ms) == ("def f(", 12, 61_000)
    assert request.reply_to == wire.KafkaReply(topic="bench.direct.ab")


def test_a_direct_summary_counts_outcomes_and_times_the_answered_ones():
    sent = {"a": 0.0, "b": 0.5, "c": 1.0, "d": 1.5}
    replies = {"a": (0.3, "succeeded"), "b": (1.5, "succeeded"), "c": (1.2, "expired")}
    summary = direct_feed.summarize(sent, replies, window_s=2.0)
    assert (summary["requests"], summary["answered"], summary["unanswered"]) == (4, 2, 1)
    assert summary["other_outcomes"] == {"expired": 1}
    assert (summary["offered_rps"], summary["throughput_rps"]) == (2.0, 1.0)
    assert summary["latency_ms"]["p50"] == pytest.approx(300.0) and summary["latency_ms"]["p99"] == pytest.approx(
        1000.0
    )


def test_kafka_fed_runs_have_their_own_rows_and_stay_out_of_the_ratios(tmp_path):
    one, three = rows()
    summary = direct_feed.summarize({"a": 0.0}, {"a": (0.25, "succeeded")}, window_s=1.0)
    cpu = scale.cpu_by_kind({"b": "batcher"}, {"b": 0.0}, {"b": 0.0003}, answered=1)
    alone = scale.direct_row(1, summary, cpu)
    assert (alone["feed"], alone["answered"], alone["p50_ms"]) == ("kafka", 1, 250.0)
    assert alone["cpu_ms_per_request"] == {"batcher": 0.3}
    runs = [{"batchers": 1, "row": one}, {"batchers": 1, "feed": "kafka", "row": alone}, {"batchers": 3, "row": three}]
    result = scale.result(scale.ScaleConfig(batchers=(1, 3), output=tmp_path / "s.json"), runs)
    assert [q["batchers"] for q in result["ratios"]] == [3]
    console = Console(record=True, width=250)
    bench_cmd.print_scale(result, console)
    text = console.export_text()
    assert "the batcher alone" in text and "1 / 1 " in text


def test_the_command_refuses_an_unknown_feed():
    refused = CliRunner().invoke(app, ["bench", "scale", "--feeds", "http,grpc"])
    assert refused.exit_code == 2 and "--feeds" in refused.output

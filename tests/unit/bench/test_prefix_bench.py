"""The prefix benchmark's workload and its pure figures."""

from __future__ import annotations

from llmq_bench import prefix_bench
from llmq_bench.prompts import SESSION_GAP, session_prompts

WORKER = """# TYPE llmq_worker_prefix_cache_hit_tokens_total counter
llmq_worker_prefix_cache_hit_tokens_total{model="llmq-sim",region="local"} 300.0
# TYPE llmq_worker_prefix_cache_query_tokens_total counter
llmq_worker_prefix_cache_query_tokens_total{model="llmq-sim",region="local"} 1000.0
"""
BATCHER = """# TYPE llmq_batcher_prefix_route_decisions_total counter
llmq_batcher_prefix_route_decisions_total{model="llmq-sim",reason="affinity",region="local"} 7.0
llmq_batcher_prefix_route_decisions_total{model="llmq-sim",reason="no_match",region="local"} 3.0
"""


def test_sessions_interleave_headers_each_repeated_at_every_cursor():
    prompts = session_prompts(headers=6, cursors=4, seed=3)
    headers = [p.prompt.split(SESSION_GAP)[0] for p in prompts]
    assert len(prompts) == 24 and len(set(headers)) == 6
    assert all(headers.count(h) == 4 for h in set(headers))
    assert all(1000 < len(h.encode()) <= 1200 and h.endswith("\n") for h in headers)
    sessions = [p.id.rsplit("-", 1)[0] for p in prompts]
    assert sessions != sorted(sessions)  # interleaved, not one session after another
    assert session_prompts(headers=6, cursors=4, seed=3) == prompts
    assert session_prompts(headers=6, cursors=4, seed=4) != prompts


def test_a_worker_budget_holds_its_share_of_the_headers():
    assert prefix_bench.budget_tokens([300, 300, 301], workers=2) == 541  # 1.2 x 901 / 2, rounded up


def test_a_row_sums_the_workers_hits_and_the_batchers_decisions():
    report = {
        "requests": 10,
        "status": {"ok": 8, "429": 1, "503": 1},
        "ttft_ms": {"p50": 1, "p90": 2, "p99": 3},
        "latency_ms": {"p50": 4, "p99": 5},
        "throughput_rps": 2.0,
        "goodput_rps": 1.5,
        "classes": {"interactive": {"good": 6, "requests": 8}},
    }
    r = prefix_bench.row("prefix", report, [WORKER, WORKER], [BATCHER])
    assert r["hit_rate"] == 0.3 and r["decisions"] == {"affinity": 7, "no_match": 3}
    assert (r["share_429"], r["share_503"], r["not_ok"]) == (0.1, 0.1, {"429": 1, "503": 1})
    assert r["goodput_by_class"] == {"interactive": 6}


def test_the_comparison_asks_half_the_ttft_p90_without_more_shedding():
    def mode(name, p90, shed):
        return {"mode": name, "ttft_ms": {"p90": p90}, "hit_rate": 0.5, "share_429": shed, "share_503": 0.0}

    met = prefix_bench.comparison([mode("prefix", 400, 0.0), mode("least_loaded", 1000, 0.0)])
    assert (met["ttft_p90_ratio"], met["goal_met"]) == (0.4, True)
    assert not prefix_bench.comparison([mode("prefix", 400, 0.2), mode("least_loaded", 1000, 0.1)])["goal_met"]
    assert not prefix_bench.comparison([mode("prefix", 600, 0.0), mode("least_loaded", 1000, 0.0)])["goal_met"]

"""The failover's check of the source region's inbound MirrorMaker 2: heartbeats decoded as MirrorMaker 2 writes
them, and the pure decision on their age."""

from llmq_jobs.heartbeats import Heartbeat, decide, heartbeats_topic, parse_heartbeat

# Written by connect-mirror-client 4.1.2's Heartbeat("b", "a", 1764662400123).recordKey() / recordValue()
KEY, VALUE = bytes.fromhex("000162000161"), bytes.fromhex("00000000019ade13547b")
NOW_MS = 1_764_662_400_000
FLOW = {"flow": "b->a", "topic": "a.heartbeats"}


def test_a_mirrormaker_heartbeat_is_decoded():
    assert parse_heartbeat(KEY, VALUE) == Heartbeat("b", "a", 1_764_662_400_123)


def test_anything_else_in_the_heartbeats_topic_is_no_heartbeat():
    for key, value in [
        (KEY, None),
        (None, VALUE),
        (KEY[:-1], VALUE),
        (KEY + b"x", VALUE),
        (KEY, b"\x00\x01" + VALUE[2:]),
    ]:
        assert parse_heartbeat(key, value) is None


def test_a_peers_heartbeats_are_read_from_its_mirrored_topic():
    assert heartbeats_topic("a") == "a.heartbeats"


def test_a_recent_heartbeat_allows_the_failover():
    verdict = decide([NOW_MS - 20_000, NOW_MS - 3_000], NOW_MS, 15_000, **FLOW)
    assert verdict.allowed
    assert verdict.reason == "the newest heartbeat of MirrorMaker 2 b->a in a.heartbeats is 3.0 s old"


def test_a_stale_heartbeat_refuses_it_saying_how_old():
    verdict = decide([NOW_MS - 40_000, NOW_MS - 15_001], NOW_MS, 15_000, **FLOW)
    assert not verdict.allowed
    assert verdict.reason == "the newest heartbeat of MirrorMaker 2 b->a in a.heartbeats is 15.0 s old (more than 15 s)"


def test_no_heartbeat_refuses_it():
    assert decide([], NOW_MS, 15_000, **FLOW) == decide([], NOW_MS, 1, **FLOW)
    assert decide([], NOW_MS, 15_000, **FLOW).reason == "no heartbeat of MirrorMaker 2 b->a in a.heartbeats"
    assert not decide([], NOW_MS, 15_000, **FLOW).allowed


def test_a_heartbeat_ahead_of_this_clock_counts_as_fresh():
    assert decide([NOW_MS + 2_000], NOW_MS, 15_000, **FLOW).allowed

"""Which of a peer region's mirrored results claim their request_id here (llmq_result_router.peers)."""

from __future__ import annotations

import re

from llmq_core import constants, wire
from llmq_result_router.peers import peer_claim


def result(reply_to: wire.ReplyTo, request_copy: str = "") -> wire.FinalResult:
    return wire.FinalResult(
        request_id="r1",
        tenant_id="t",
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        reply_to=reply_to,
        request_copy=request_copy,
    )


def test_a_kafka_direct_answer_claims_its_id_at_its_mirrored_position_without_a_fingerprint():
    claim = peer_claim(result(wire.KafkaReply(topic="team.replies")), "a.llmq.results", 2, 41)
    assert claim == "a.llmq.results/2@41 "
    position, _, fingerprint = claim.partition(" ")
    assert position != "llmq.requests.interactive/2@41" and fingerprint == ""  # never a local record's position


def test_http_job_and_replayed_answers_claim_nothing():
    assert peer_claim(result(wire.HttpReply(instance_id="a-api-0")), "a.llmq.results", 0, 1) is None
    assert peer_claim(result(wire.JobReply(batch_id="batch_a-1", custom_id="c")), "a.llmq.results", 0, 1) is None
    replay = result(wire.KafkaReply(topic="team.replies"), request_copy="llmq.requests.interactive/0@9")
    assert peer_claim(replay, "a.llmq.results", 0, 1) is None


def test_the_pattern_matches_every_peers_mirrored_results_and_nothing_else():
    pattern = re.compile(constants.PEER_RESULTS_PATTERN)
    assert pattern.match(constants.remote_topic("a", constants.TOPIC_RESULTS))
    assert pattern.match(constants.remote_topic("eu-west-1", constants.TOPIC_RESULTS))
    for topic in (constants.TOPIC_RESULTS, "a.llmq.results.x", "a.b.llmq.results", "a.llmq.jobs.ledger"):
        assert not pattern.match(topic), topic

"""Kafka-direct requests at the batcher's entry (issue 13, items 7 and 9): the API's checks answer a faulty one errored
at once (it used to wait for its deadline and expire), deadlines are clamped to the class maximum, and a re-produced
request_id gets the stored result again, or errored ``request_id_reused``; it used to get nothing."""

from __future__ import annotations

import msgspec

from llmq_batcher.intake import EntryRules
from llmq_core import constants, ids, requests, wire
from tests.fakes import Record
from tests.unit.batcher.helpers import INTERACTIVE, NAMES, T0, hb, req
from tests.unit.batcher.helpers import make_loop as make_batcher

REPLIES = wire.KafkaReply(topic="team.replies")


def rid(request_id: str = "r1") -> str:
    """The id acme's Kafka-direct ``request_id`` runs under (tenant-scoped)."""
    return ids.tenant_scoped_id("acme", request_id)


def direct(request_id: str = "r1", **fields) -> wire.GenerationRequest:
    return msgspec.structs.replace(req(request_id), **{"reply_to": REPLIES, **fields})


def stored_result() -> wire.FinalResult:
    """What the result-router stored for ``r1``: its first answer, acme's, to REPLIES."""
    return wire.FinalResult(
        request_id=rid(),
        outcome=wire.Outcome.SUCCEEDED,
        model="llmq-sim",
        tenant_id="acme",
        reply_to=REPLIES,
        choices=[wire.Choice(index=0, text="hi", finish_reason="stop")],
    )


def make_loop():
    loop, _, producer, redis = make_batcher(entry=EntryRules(requests.Rules(max_timeout_ms={"interactive": 60_000})))
    return loop, loop.policy, producer, redis


async def put(loop, request: wire.GenerationRequest, offset: int = 0) -> None:
    await loop.ingest(INTERACTIVE, Record(offset=offset, value=wire.encode(request), key=request.request_id.encode()))


def answers(producer) -> list[wire.FinalResult]:
    return [wire.decode(s["value"]) for s in producer.on(NAMES.results_topic)]


async def test_a_faulty_request_is_answered_errored_at_once_with_the_apis_error():
    loop, policy, producer, _ = make_loop()
    await put(loop, direct(model="no-such-model"), 0)
    await put(loop, direct("r2", sampling=wire.SamplingParams(temperature=9.0)), 1)
    unknown, hot = answers(producer)
    assert (unknown.outcome, unknown.error.code, unknown.error.param) == (
        wire.Outcome.ERRORED,
        "model_not_found",
        "model",
    )
    assert unknown.error.message == "The model 'no-such-model' does not exist" and unknown.reply_to == REPLIES
    assert (hot.error.type, hot.error.param, hot.error.code) == ("invalid_request_error", "temperature", "out_of_range")
    assert policy.queued_total == 0 and "no-such-model" not in policy.model_states(T0)  # no per-model state grew


async def test_a_deadline_beyond_the_class_maximum_is_clamped():
    loop, policy, producer, _ = make_loop()
    await put(loop, direct(deadline_ms=T0 + 10**12))
    assert producer.sent == [] and policy.queued_total == 1
    (entry,) = policy.schedule(T0 + 60_001).answers  # expired at the clamped deadline, not in years
    assert entry.outcome is wire.Outcome.EXPIRED


async def test_a_reproduced_finished_id_gets_its_stored_result_again_once_per_copy():
    loop, policy, producer, redis = make_loop()
    await put(loop, direct(), 3)
    first = stored_result()
    redis.data[constants.result_key(rid())] = wire.encode(first)
    policy.on_result(rid())
    policy.schedule(T0)  # the first copy is no longer held
    other_topic = wire.KafkaReply(topic="team.other")
    await put(loop, direct(reply_to=other_topic), 9)
    (replay,) = answers(producer)
    assert replay.choices == first.choices and replay.outcome is wire.Outcome.SUCCEEDED
    assert (replay.reply_to, replay.request_copy) == (other_topic, f"{INTERACTIVE.topic}/{INTERACTIVE.partition}@9")


async def test_a_reproduced_id_without_a_stored_result_is_errored_naming_it():
    loop, _, producer, redis = make_loop()
    redis.data[constants.request_copy_key(rid())] = b"llmq.requests.interactive/0@1"
    await put(loop, direct(), 5)
    (reused,) = answers(producer)
    assert (reused.outcome, reused.error.code, reused.error.param) == (
        wire.Outcome.ERRORED,
        "request_id_reused",
        "request_id",
    )
    assert "'r1'" in reused.error.message and reused.request_copy.endswith("@5")


async def test_another_tenants_or_an_http_result_is_never_replayed():
    loop, _, producer, redis = make_loop()
    for n, (tenant, reply) in enumerate([("other", REPLIES), ("acme", wire.HttpReply(instance_id="pod"))]):
        request_id = f"r{n}"
        redis.data[constants.request_copy_key(rid(request_id))] = b"elsewhere"
        redis.data[constants.result_key(rid(request_id))] = wire.encode(
            wire.FinalResult(
                request_id=request_id,
                outcome=wire.Outcome.SUCCEEDED,
                model="llmq-sim",
                tenant_id=tenant,
                reply_to=reply,
            )
        )
        await put(loop, direct(request_id), n)
    assert [a.error.code for a in answers(producer)] == ["request_id_reused"] * 2


async def test_a_redelivered_record_is_not_a_copy_and_a_copy_of_a_held_id_joins_it():
    loop, policy, producer, redis = make_loop()
    await put(loop, direct(), 4)
    await put(loop, direct(), 4)  # the same record again (a rebalance): not a copy
    await put(loop, direct(), 8)  # a copy while the first is queued: suppressed, one answer
    assert producer.sent == [] and policy.queued_total == 1
    claim = f"{INTERACTIVE.topic}/{INTERACTIVE.partition}@4 {requests.fingerprint(direct())}"
    assert redis.data[constants.request_copy_key(rid())] == claim.encode()


async def test_a_reproduced_id_with_other_parameters_is_errored_not_given_the_first_result():
    loop, policy, producer, redis = make_loop()
    await put(loop, direct(), 4)
    redis.data[constants.result_key(rid())] = wire.encode(
        wire.FinalResult(
            request_id=rid(), outcome=wire.Outcome.SUCCEEDED, model="llmq-sim", tenant_id="acme", reply_to=REPLIES
        )
    )
    await put(loop, direct(prompt="DIFFERENT"), 5)  # while the first is held: it must not join it either
    policy.on_result(rid())
    policy.schedule(T0)
    await put(loop, direct(sampling=wire.SamplingParams(max_tokens=9)), 6)
    await put(loop, direct(deadline_ms=T0 + 5_000, reply_to=wire.KafkaReply(topic="team.other")), 7)  # a true repeat
    differ, differ_later, repeat = answers(producer)
    for answer in (differ, differ_later):
        assert (answer.outcome, answer.error.code, answer.error.param) == (
            wire.Outcome.ERRORED,
            "request_id_reused",
            "request_id",
        )
        assert "different parameters" in answer.error.message
    assert [differ.request_copy[-2:], differ_later.request_copy[-2:]] == ["@5", "@6"]
    assert repeat.outcome is wire.Outcome.SUCCEEDED and repeat.request_copy.endswith("@7")


async def test_records_with_http_or_job_replies_get_the_same_checks_and_clamp():
    loop, policy, producer, redis = make_loop()
    http, job = wire.HttpReply(instance_id="api-0"), wire.JobReply(batch_id="b1", custom_id="c1")
    await put(loop, direct("h1", reply_to=http, sampling=wire.SamplingParams(n=1000)), 0)
    await put(loop, direct("j1", reply_to=job, model="no-such-model"), 1)
    await put(loop, direct("h2", reply_to=http, deadline_ms=T0 + 10**12), 2)
    many, unknown = answers(producer)
    assert (many.outcome, many.error.param, many.reply_to) == (wire.Outcome.ERRORED, "n", http)
    assert (unknown.error.code, unknown.reply_to) == ("model_not_found", job)
    assert [c for c, _ in redis.published] == [constants.replies_channel("api-0")]  # the pod hears it at once
    assert wire.decode(redis.published[0][1]).request_id == "h1"
    assert policy.queued_total == 1 and policy.schedule(T0 + 60_001).answers[0].outcome is wire.Outcome.EXPIRED
    assert not any(k.startswith(constants.request_copy_key("")) for k in redis.data)  # API ids are not claimed


async def test_a_model_a_worker_announced_passes_as_at_the_api_until_its_heartbeats_stop():
    loop, policy, producer, _ = make_loop()
    loop.signals.on_signal(wire.encode(hb("w1", model="fake-model")))
    job = wire.JobReply(batch_id="b1", custom_id="c1")
    await put(loop, direct("j1", reply_to=job, model="fake-model"), 0)
    assert producer.sent == [] and policy.holds("j1")
    loop.clock.advance(constants.SEEN_MODEL_TTL_MS + 1)
    await put(loop, direct("j2", reply_to=job, model="fake-model", deadline_ms=T0 + 10**9), 1)
    (unknown,) = answers(producer)
    assert (unknown.request_id, unknown.error.code) == ("j2", "model_not_found")


async def test_a_copy_of_an_id_in_flight_whose_result_is_stored_gets_that_result_and_one_without_joins():
    """The results tail reads llmq.results a fetch wait behind the router, so a producer that got its answer may
    re-send the id while the batcher still counts it in flight: a stored result says it finished (the copy used to
    join a twin that nothing would answer again); with none stored, the copy joins its twin (one answer for both)."""
    loop, policy, producer, redis = make_loop()
    policy.on_heartbeat(hb("w1", free=8), loop.clock.now_ms())
    for request_id in ("r1", "r2"):
        await put(loop, direct(request_id), int(request_id[1]))
    await loop.step()
    assert policy.in_flight(rid("r1")) and policy.in_flight(rid("r2"))
    finished = stored_result()
    redis.data[constants.result_key(rid())] = wire.encode(finished)  # the router stored it; the tail has not read it
    await put(loop, direct("r1"), 8)
    await put(loop, direct("r2"), 9)
    (replay,) = answers(producer)
    assert (replay.request_id, replay.choices, replay.request_copy[-2:]) == (rid("r1"), finished.choices, "@8")
    assert not policy.holds(rid("r1")) and policy.in_flight(rid("r2"))


async def test_the_same_id_of_two_tenants_runs_twice_and_a_reuse_is_seen_only_by_its_tenant():
    """Issue 34 item 1: the id namespace was shared by all tenants, so one tenant's reuse of an id answered the other
    tenant's request errored."""
    loop, policy, producer, _ = make_loop()
    beta_replies = wire.KafkaReply(topic="beta.replies")
    await put(loop, direct("order-1"), 0)
    await put(loop, direct("order-1", tenant_id="beta", reply_to=beta_replies), 1)
    assert producer.sent == [] and policy.queued_total == 2  # neither is a copy of the other
    await put(loop, direct("order-1", prompt="DIFFERENT"), 2)  # acme reuses its own id
    (reused,) = answers(producer)
    assert (reused.tenant_id, reused.reply_to, reused.error.code) == ("acme", REPLIES, "request_id_reused")
    assert "'order-1'" in reused.error.message  # the id the producer gave, not the scoped one
    assert policy.holds(ids.tenant_scoped_id("beta", "order-1")) and policy.queued_total == 2

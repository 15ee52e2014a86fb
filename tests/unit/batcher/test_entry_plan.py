"""The pure entry plan of a consumed record (llmq_batcher.entry_plan): every branch, with no Redis client. This module
imports nothing from redis, and neither does the planner (checked in a fresh interpreter: this package's conftest
imports the loop, which does)."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from llmq_batcher import ingress
from llmq_batcher.entry_plan import (
    Claim,
    DeadLetter,
    Join,
    Postpone,
    Queue,
    ReadStored,
    Refuse,
    Replay,
    Twin,
    claim_answer,
    decoded_result,
    plan_arrival,
    plan_checked,
    plan_claimed,
    plan_stored,
    position_of,
    rules_now,
    scoped,
)
from llmq_core import constants, ids, requests, wire
from llmq_core.settings import IngressGrant
from llmq_core.status import ErrorCode
from tests.builders import generation_request

T0 = 1_700_000_000_000
MODEL = "llmq-sim"
REPLIES = wire.KafkaReply(topic="team.replies")
POSITION = position_of("llmq.ingress.team", 0, 7)
GRANT = IngressGrant(tenant_id="acme", classes=("interactive",), reply_topic_prefixes=("team.",))
RULES = requests.Rules(max_timeout_ms={"interactive": 60_000}, max_job_timeout_ms=3_600_000)


def request(request_id: str = "r1", **fields) -> wire.GenerationRequest:
    """acme's interactive request for llmq-sim, due in 10 s, replying to REPLIES."""
    fields = {"tenant_id": "acme", "reply_to": REPLIES, **fields}
    return msgspec.structs.replace(generation_request(request_id, now_ms=T0, deadline_in_ms=10_000), **fields)


def arrival(message, grant: IngressGrant | None = None, prefixes: tuple[str, ...] = ()):
    return plan_arrival(message, grant, POSITION, prefixes, RULES, T0)


def stored(tenant_id: str = "acme", reply_to: wire.ReplyTo = REPLIES) -> wire.FinalResult:
    return wire.FinalResult(
        request_id="r1",
        outcome=wire.Outcome.SUCCEEDED,
        model=MODEL,
        tenant_id=tenant_id,
        reply_to=reply_to,
        choices=[wire.Choice(index=0, text="hi", finish_reason="stop")],
    )


def test_the_planner_imports_no_redis_client():
    probe = "import sys, llmq_batcher.entry_plan; print(sorted(m for m in sys.modules if m.split('.')[0] == 'redis'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- stage 1: arrival -------------------------------------------------------------------------------------------------


def test_a_record_that_is_not_a_request_is_dead_lettered():
    assert arrival(wire.Cancel(request_id="r1")) == DeadLetter("not a generation_request: Cancel")


@pytest.mark.parametrize("reply", [wire.HttpReply(instance_id="api-0"), wire.JobReply(batch_id="b", custom_id="c")])
def test_an_ingress_record_not_replying_to_kafka_is_dead_lettered_and_counted(reply):
    plan = arrival(request(reply_to=reply), GRANT)
    assert isinstance(plan, DeadLetter) and plan.ingress_reason == ingress.REPLY_NOT_KAFKA
    assert plan.reason == ingress.reply_refusal(request(reply_to=reply))


def test_a_refused_reply_topic_is_refused_first_even_past_a_refusing_grant():
    message = request(tenant_id="victim", reply_to=wire.KafkaReply(topic="llmq.batches"))
    plan = arrival(message, GRANT)
    assert isinstance(plan, Refuse) and plan.request == scoped(request(reply_to=message.reply_to))  # acme's refusal
    assert (plan.error.code, plan.error.param, plan.ingress_reason) == (
        ErrorCode.INVALID_REPLY_TOPIC,
        "reply_to.topic",
        None,
    )


@pytest.mark.parametrize("tenant_id", ["acme", "beta"])
def test_an_ingress_record_may_name_only_its_producers_reply_topics(tenant_id):
    message = request(tenant_id=tenant_id, reply_to=wire.KafkaReply(topic="replies.beta"))  # beta's topic
    plan = arrival(message, GRANT)
    assert isinstance(plan, Refuse) and plan.request == scoped(request(reply_to=message.reply_to))
    assert (plan.error.code, plan.error.param, plan.ingress_reason) == (
        ErrorCode.INVALID_REPLY_TOPIC,
        "reply_to.topic",
        ErrorCode.INVALID_REPLY_TOPIC,
    )
    assert "team." in plan.error.message  # names the prefixes it may use


def test_an_ingress_record_naming_no_tenant_runs_as_its_producers_tenant():
    message = request(tenant_id=wire.DEFAULT_TENANT_ID)
    plan = arrival(message, GRANT)
    assert isinstance(plan, Claim) and plan.request == scoped(request())


def test_ids_of_different_tenants_are_claimed_apart_and_answered_under_the_producers_id():
    acme, beta = arrival(request("order-1")), arrival(request("order-1", tenant_id="beta"))
    assert acme.request.request_id != beta.request.request_id
    assert {ids.producer_request_id(plan.request.request_id) for plan in (acme, beta)} == {"order-1"}


def test_a_tenant_id_that_cannot_scope_ids_is_dead_lettered():
    plan = arrival(request(tenant_id="acme:beta"))
    assert isinstance(plan, DeadLetter) and "must not contain ':'" in plan.reason


def test_a_reply_topic_outside_the_allowed_prefixes_is_refused():
    plan = arrival(request(), prefixes=("etl-",))
    assert isinstance(plan, Refuse) and plan.error.code == ErrorCode.INVALID_REPLY_TOPIC


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"tenant_id": "victim"}, ErrorCode.TENANT_NOT_ALLOWED),
        ({"traffic_class": "near_interactive"}, ErrorCode.CLASS_NOT_ALLOWED),
    ],
)
def test_an_ingress_record_past_its_grant_is_refused_as_its_topics_tenant(fields, code):
    plan = arrival(request(**fields), GRANT)
    assert isinstance(plan, Refuse) and (plan.error.code, plan.ingress_reason) == (code, code)
    assert plan.request.tenant_id == "acme" and plan.request_copy == ""
    assert plan.request.request_id == ids.tenant_scoped_id("acme", "r1")  # no id of the claimed tenant is taken


@pytest.mark.parametrize("grant", [None, GRANT])
def test_a_kafka_direct_request_needs_its_ids_claim(grant):
    message = request()
    assert arrival(message, grant) == Claim(scoped(message), POSITION, requests.fingerprint(message))


def test_an_api_pods_record_goes_straight_to_the_checks():
    http = request(reply_to=wire.HttpReply(instance_id="api-0"), deadline_ms=T0 + 10**9)
    plan = arrival(http)
    assert isinstance(plan, Queue) and plan.request.deadline_ms == T0 + 60_000
    refused = arrival(msgspec.structs.replace(http, model="no-such-model"))
    assert isinstance(refused, Refuse) and refused.error.code == "model_not_found"


# --- the checks -------------------------------------------------------------------------------------------------------


def test_a_faulty_request_is_refused_with_the_apis_error():
    plan = plan_checked(request(sampling=wire.SamplingParams(temperature=9.0)), RULES, T0)
    assert isinstance(plan, Refuse) and (plan.error.param, plan.error.code) == ("temperature", "out_of_range")


@pytest.mark.parametrize(
    "fields, deadline_ms",
    [
        ({}, T0 + 10_000),  # within the class's maximum: as it came
        ({"deadline_ms": T0 + 10**12}, T0 + 60_000),  # clamped to it
        ({"deadline_ms": T0 + 10**12, "traffic_class": "deferred"}, T0 + 10**12),  # no maximum for the class
        (
            {"deadline_ms": T0 + 10**12, "reply_to": wire.JobReply(batch_id="b", custom_id="c")},
            T0 + 3_600_000,  # a batch-job line: the longest batch window
        ),
    ],
)
def test_the_deadline_is_clamped_to_the_class_maximum(fields, deadline_ms):
    plan = plan_checked(request(**fields), RULES, T0)
    assert isinstance(plan, Queue) and plan.request.deadline_ms == deadline_ms


def test_a_request_created_ahead_is_clamped_from_now():
    plan = plan_checked(request(created_ms=T0 + 5_000, deadline_ms=T0 + 10**12), RULES, T0)
    assert plan.request.deadline_ms == T0 + 60_000


def test_rules_accept_models_workers_announced_lately_and_keep_the_catalogues_windows():
    assert rules_now(RULES, {}, T0) is RULES
    assert rules_now(RULES, {MODEL: (1, T0)}, T0) is RULES  # a catalogue model: nothing to add
    assert rules_now(RULES, {"fake": (2048, T0 - constants.SEEN_MODEL_TTL_MS - 1)}, T0) is RULES  # heard too long ago
    extended = rules_now(RULES, {"fake": (2048, T0 - constants.SEEN_MODEL_TTL_MS), MODEL: (1, T0)}, T0)
    assert extended.windows == {**RULES.windows, "fake": 2048}
    assert extended.max_timeout_ms == RULES.max_timeout_ms


# --- stage 2: after the claim -----------------------------------------------------------------------------------------


def claimed(message: wire.GenerationRequest, earlier: str | None, twin: Twin = Twin.NONE):
    return plan_claimed(message, Claim(message, POSITION, requests.fingerprint(message)), earlier, twin, RULES, T0)


def test_the_first_record_of_an_id_goes_to_the_checks():
    assert claimed(request(), None) == Queue(request())
    assert isinstance(claimed(request(model="no-such-model"), None), Refuse)


@pytest.mark.parametrize("twin", list(Twin))
def test_a_copy_with_other_parameters_is_refused_naming_its_position(twin):
    plan = claimed(request(), "another-fingerprint", twin)
    assert isinstance(plan, Refuse) and plan.error.code == ErrorCode.REQUEST_ID_REUSED
    assert "different parameters" in plan.error.message and plan.request_copy == POSITION


@pytest.mark.parametrize("same", [True, False])  # "": a claim that carries no fingerprint
def test_a_true_copy_of_a_queued_id_joins_it_unchecked(same):
    message = request(model="no-such-model")  # unchecked: it cannot answer in its twin's place
    assert claimed(message, requests.fingerprint(message) if same else "", Twin.QUEUED) == Join(message)


@pytest.mark.parametrize("twin", [Twin.NONE, Twin.IN_FLIGHT])
def test_any_other_true_copy_needs_the_stored_result(twin):
    message = request()
    assert claimed(message, requests.fingerprint(message), twin) == ReadStored(twin)


# --- stage 3: after the stored result ---------------------------------------------------------------------------------


@pytest.mark.parametrize("result", [None, False])
def test_a_copy_of_an_id_in_flight_without_a_readable_result_joins_its_twin(result):
    assert plan_stored(request(), POSITION, Twin.IN_FLIGHT, result) == Join(request())


def test_a_copy_of_an_id_in_flight_whose_result_is_stored_gets_it_and_ends_the_twin():
    plan = plan_stored(request(), POSITION, Twin.IN_FLIGHT, stored())
    assert isinstance(plan, Replay) and plan.twin_tenant == "acme" and plan.result.request_copy == POSITION
    assert plan.result.choices == stored().choices


def test_a_copy_of_an_id_in_flight_whose_result_may_not_be_given_is_refused_and_ends_the_twin():
    plan = plan_stored(request(), POSITION, Twin.IN_FLIGHT, stored(tenant_id="other"))
    assert isinstance(plan, Refuse) and plan.error.code == ErrorCode.REQUEST_ID_REUSED
    assert (plan.twin_tenant, plan.request_copy) == ("other", POSITION)


def test_a_copy_of_an_id_not_held_gets_the_stored_result_re_addressed():
    other_topic = wire.KafkaReply(topic="team.other")
    plan = plan_stored(request(reply_to=other_topic), POSITION, Twin.NONE, stored())
    assert isinstance(plan, Replay) and plan.twin_tenant is None
    assert (plan.result.reply_to, plan.result.request_copy, plan.result.outcome) == (
        other_topic,
        POSITION,
        wire.Outcome.SUCCEEDED,
    )


@pytest.mark.parametrize(
    "result", [None, stored(tenant_id="other"), stored(reply_to=wire.HttpReply(instance_id="api-0"))]
)
def test_a_copy_of_an_id_not_held_without_a_result_to_give_is_refused(result):
    plan = plan_stored(request(), POSITION, Twin.NONE, result)
    assert isinstance(plan, Refuse) and plan.error.code == ErrorCode.REQUEST_ID_REUSED
    assert "'r1'" in plan.error.message and (plan.request_copy, plan.twin_tenant) == (POSITION, None)


def test_a_copy_of_an_id_not_held_waits_for_a_restart_when_redis_cannot_be_read():
    assert plan_stored(request(), POSITION, Twin.NONE, False) == Postpone()


# --- what Redis answered, read ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first, earlier",
    [
        (None, None),  # nothing was there: this record claimed it
        (f"{POSITION} abc".encode(), None),  # its own claim: a redelivery is not a copy
        (b"llmq.requests.interactive/0@1 abc", "abc"),
        (b"llmq.requests.interactive/0@1", ""),  # a claim without a fingerprint
    ],
)
def test_the_claims_answer(first, earlier):
    assert claim_answer(first, POSITION) == earlier


def test_a_stored_result_is_read_only_when_it_is_one():
    assert decoded_result(wire.encode(stored())) == stored()
    assert decoded_result(None) is None
    assert decoded_result(b"\xc1garbage") is None
    assert decoded_result(wire.encode(wire.Cancel(request_id="r1"))) is None

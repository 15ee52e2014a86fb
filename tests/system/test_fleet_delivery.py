"""Delivery with several batchers and result-routers (issue 28, item 2): real processes, counts only, never timings.

One stack for the module: two API pods, three batchers (one consumer group over the request topics' 4 partitions),
three result-routers (one group over llmq.results), two llmq-sim workers with far more capacity than the load (64 per
200 ms each), so every request is answered and any other ending is a delivery fault. Each test runs HTTP load and
Kafka-direct load (its own reply topic) through one change of the fleet and counts, for every request, how it ended
(tests/system/faults/loadgen.py): a batcher SIGKILLed, a fourth batcher joining, the result-router driving a batch
job SIGKILLed mid-job. The tests run in file order; each starts what an earlier one killed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid

import openai
import pytest

from llmq_cli.batch import sample_lines
from llmq_cli.devstack import replica_name
from llmq_core import constants, kafka, wire
from tests import ports
from tests.stacks import standalone_stack
from tests.system.faults.loadgen import Ending, HttpLoad, KafkaLoad, Tally
from tests.system.faults.stack import FaultStack, Tap

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long(50)]

BASE = ports.block()
BATCHERS = ROUTERS = 3
HTTP_RATE_PER_S = 12
KAFKA_RATE_PER_S = 4
TIMEOUT_MS = 90_000  # far past a rebalance (session timeout 10 s): every request is answered, none given up
STUCK_S = 180  # a wait longer than this is a hang: the test fails instead of blocking the run
JOB_LINES = 1500
JOB_KILL_AT = 150  # lines completed when the driving router is killed
ENV = {
    "LLMQ_BATCH_LEASE_MS": "3000",  # a killed router's jobs move within 3 s
    # no pod or worker dies here: on a starved machine a late heartbeat must not read as one (cancels, re-dispatch)
    "LLMQ_API_POD_HEARTBEAT_TTL_MS": "30000",
    "LLMQ_BATCHER_WORKER_HEARTBEAT_TIMEOUT_MS": "15000",
    # admission must not shed what waits on a dead batcher's partitions until the group rebalances
    "LLMQ_API_SHED_WAIT_MS": json.dumps(
        {"interactive:paid": 120_000, "interactive:free": 120_000, "near_interactive": 120_000, "deferred": 120_000}
    ),
}


@pytest.fixture(scope="module")
def fleet(infra, tmp_path_factory):
    own = dict(state_dir=tmp_path_factory.mktemp("fleet-delivery-infra"), kafka_port=BASE + 40, redis_port=BASE + 45)
    shape = dict(
        api_ports=(BASE, BASE + 1),
        tiny_workers=0,
        sim_workers=2,
        sim_batch_time_ms=200,
        sim_max_batch_size=64,
        batchers=BATCHERS,
        routers=ROUTERS,
        extra_env={**ENV, "LLMQ_FILES_URL": str(tmp_path_factory.mktemp("fleet-files"))},
    )
    with standalone_stack(infra, own, "fleet-delivery", **shape) as running:
        yield FaultStack(running.cfg)


@pytest.fixture
async def stack(fleet):
    await fleet.heal()  # what an earlier test killed runs again
    return fleet


async def start_load(stack: FaultStack, tag: str) -> tuple[HttpLoad, KafkaLoad]:
    reply_topic = f"fleet.replies.{uuid.uuid4().hex[:8]}"
    await kafka.create_topic(stack.cfg.settings(), reply_topic)
    direct = KafkaLoad(stack.cfg.kafka_bootstrap, reply_topic, rate_per_s=KAFKA_RATE_PER_S, timeout_ms=TIMEOUT_MS)
    http = HttpLoad(stack.api_ports, rate_per_s=HTTP_RATE_PER_S, timeout_ms=TIMEOUT_MS, tag=tag)
    await direct.start()
    http.start()
    return http, direct


async def stop_load(http: HttpLoad, direct: KafkaLoad) -> tuple[Tally, Tally]:
    return await http.stop(), await direct.stop(settle_s=TIMEOUT_MS / 1000)


def each_answered_once(tally: Tally, what: str) -> None:
    """Every request ended answered once with its own text: none lost, twice, wrong, dropped or refused."""
    assert len(tally) > 0, f"no {what} request was sent"
    assert tally.count(Ending.ONCE) == len(tally), f"{what}: {tally.summary()}; first: {tally.failures()[:3]}"


async def running_batches(stack: FaultStack, count: int) -> None:
    """Wait until the fleet has formed ``count`` more batches (llmq:stats:batcher): the load is flowing."""
    redis = stack.redis()
    try:
        start = int(await redis.hget(constants.STATS_BATCHER, "batches") or 0)
        async with asyncio.timeout(STUCK_S):
            while int(await redis.hget(constants.STATS_BATCHER, "batches") or 0) < start + count:
                await asyncio.sleep(0.1)
    finally:
        await redis.aclose()


async def group_settled(stack: FaultStack, members: int) -> None:
    """The batchers' group rebalanced to ``members`` (a dead one's session timed out, or a new one joined)."""
    await kafka.await_group(stack.cfg.settings(), constants.GROUP_BATCHER, members, STUCK_S)


async def test_one_of_three_batchers_killed_under_load_leaves_exactly_one_outcome_per_request(stack):
    assert len(stack.names("batcher")) == BATCHERS
    http, direct = await start_load(stack, "batcher-kill")
    await running_batches(stack, 10)
    killed_s = stack.send("batcher-1", signal.SIGKILL)
    # the load goes on until the two survivors have taken the dead one's partitions, and a while after
    await group_settled(stack, BATCHERS - 1)
    await running_batches(stack, 20)
    http_tally, direct_tally = await stop_load(http, direct)
    assert not stack.alive("batcher-1")
    assert len(http_tally.where(since_s=killed_s)) > 0, "no request was sent after the kill"
    each_answered_once(http_tally, "HTTP")
    each_answered_once(direct_tally, "Kafka-direct")  # every Kafka reply delivered once


async def test_a_fourth_batcher_joining_under_load_leaves_exactly_one_outcome_per_request(stack):
    batches = Tap(stack.cfg.kafka_bootstrap, constants.TOPIC_BATCHES)
    await batches.start()
    http, direct = await start_load(stack, "batcher-join")
    try:
        await running_batches(stack, 10)
        assert await stack.scale(batchers=BATCHERS + 1) == ["batcher-3"]
        await group_settled(stack, BATCHERS + 1)
        await running_batches(stack, 20)
        http_tally, direct_tally = await stop_load(http, direct)
    finally:
        await batches.stop()
    each_answered_once(http_tally, "HTTP")
    each_answered_once(direct_tally, "Kafka-direct")
    joined = stack.cfg.instance_id("batcher-3")
    by_joined = [b for b in batches.messages(wire.Batch) if b.batch_id.startswith(f"{joined}-")]
    assert by_joined, "the fourth batcher formed no batch: it never took a partition"


async def test_the_router_driving_a_job_killed_mid_job_leaves_each_custom_id_once(stack):
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{stack.api_ports[0]}/v1", api_key="llmq-dev-key", max_retries=0, timeout=120
    )
    lines = sample_lines(JOB_LINES, "llmq-sim", seed=28)
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = await client.files.create(file=("input.jsonl", data), purpose="batch")
    http, direct = await start_load(stack, "router-kill")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    async with asyncio.timeout(STUCK_S):
        while (batch := await client.batches.retrieve(batch.id)).request_counts.completed < JOB_KILL_AT:
            await asyncio.sleep(0.2)
    redis = stack.redis()
    try:
        async with asyncio.timeout(STUCK_S):  # held all along but for a lapse of a starved holder: wait it out
            while (lease := await redis.get(constants.job_lease_key(batch.id))) is None:
                await asyncio.sleep(0.05)
    finally:
        await redis.aclose()
    holder = lease.decode().split("/")[0]
    routers = {stack.cfg.instance_id(f"result-router-{i}"): replica_name("result-router", i) for i in range(ROUTERS)}
    stack.send(routers[holder], signal.SIGKILL)
    frozen = (await client.batches.retrieve(batch.id)).request_counts.completed
    async with asyncio.timeout(STUCK_S):
        while (batch := await client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
            await asyncio.sleep(0.5)
    http_tally, direct_tally = await stop_load(http, direct)
    output = [json.loads(x) for x in (await client.files.content(batch.output_file_id)).text.splitlines()]
    errors = []
    if batch.error_file_id:
        errors = [json.loads(x) for x in (await client.files.content(batch.error_file_id)).text.splitlines()]
    assert frozen < JOB_LINES, "the job ended before the kill: nothing was tested"
    ids = sorted(x["custom_id"] for x in output + errors)
    assert ids == sorted(x["custom_id"] for x in lines), "a custom_id is missing or repeated"
    assert batch.status == "completed" and errors == []
    each_answered_once(http_tally, "HTTP")
    each_answered_once(direct_tally, "Kafka-direct")  # every Kafka reply delivered once, a router down or not

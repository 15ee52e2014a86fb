"""A batch job survives the loss of its region (docs/operations/multi-region.md): regions a and b on this machine with
MirrorMaker 2 both ways (the package's secure regions: tests/system/regions/conftest.py); a 2,000-line llmq-sim job submitted in a; at about 30% done every process
of a is SIGKILLed (Kafka, Redis, services, the MirrorMaker 2 copying b into a) and a's file store is made unreadable;
``llmq region failover --from a --force`` in b (a is lost: its inbound mirror beats no more); b finishes the job
under the same batch id with every custom_id exactly once across its output and error files. Measured and printed: the replication lag of the job's ledger a -> b (RPO p99),
the time from the failover command to b's first progress on the job (RTO), the executions from what survives, and,
once a is back, the lines both regions ran (reruns). Then the fail-back: a takes the job back
(``llmq region failover --from b --failback``) and serves the same 2,000 lines once each."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from aiokafka import TopicPartition

from llmq_cli.devstack import DevStack
from llmq_core import kafka
from llmq_jobs.joblog import JobTopics, read_topics
from tests.stacks import wait_for_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]  # two whole stacks, MM2, failover

LINES = 2000
KILL_AT = 0.3
RPO_P99_S = 5.0  # the goals
RTO_S = 60.0
ENDED = ("completed", "failed", "expired", "cancelled")
LLMQ = str(Path(sys.executable).with_name("llmq"))


def client(stack: DevStack) -> openai.AsyncOpenAI:
    base_url = f"http://127.0.0.1:{stack.cfg.api_ports[0]}/v1"
    return openai.AsyncOpenAI(base_url=base_url, api_key="llmq-dev-key", max_retries=2, timeout=60)


def region_command(stack: DevStack, *args: str) -> list[dict]:
    """``llmq region ARGS`` against ``stack``'s region; its JSON lines."""
    env = {**os.environ, **stack.cfg.env(), "LLMQ_FILES_URL": str(stack.state / "files")}
    done = subprocess.run([LLMQ, "region", *args], env=env, capture_output=True, text=True, timeout=300, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def settled(batch) -> int:
    counts = batch.request_counts
    return counts.completed + counts.failed


async def wait_batch(api: openai.AsyncOpenAI, batch_id: str, until, timeout_s: float):
    """Poll the batch until ``until(batch)``; TimeoutError past ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            batch = await api.batches.retrieve(batch_id)
            if await until(batch):
                return batch
            await asyncio.sleep(0.2)


async def files_ids(api: openai.AsyncOpenAI, batch) -> list[str]:
    """The custom_ids of the batch's output and error files, in one list."""
    ids = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        text = (await api.files.content(file_id)).text
        ids += [json.loads(line)["custom_id"] for line in text.splitlines() if line]
    return ids


async def follow_lag(settings, topic: str, batch_id: str, lags: list[float], stop: asyncio.Event) -> None:
    """Each mirrored ledger record of the job: seconds from its creation in a to its arrival here (one clock)."""
    consumer = kafka.make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        while not stop.is_set():
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                now = time.time()
                lags += [now - r.timestamp / 1000 for r in batch if r.key.decode().startswith(batch_id)]
    finally:
        await consumer.stop()


async def test_a_job_survives_the_loss_of_its_region_and_fails_back(regions, tmp_path):
    a, b = regions.a, regions.b
    a_settings, b_settings = a.cfg.settings(), b.cfg.settings()
    mirrored = JobTopics.mirrored(a.cfg.region)
    await wait_for_topic(b_settings, mirrored.topic("ledger"))  # a's router created it; b's MirrorMaker 2 copies it
    source = tmp_path / "job.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"line-{i:04d}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "llmq-sim", "max_tokens": 8, "messages": [{"role": "user", "content": f"q{i}"}]},
                }
            )
            + "\n"
            for i in range(LINES)
        )
    )
    api_a, api_b = client(a), client(b)
    file = await api_a.files.create(file=source.open("rb"), purpose="batch")
    lags: list[float] = []
    stop = asyncio.Event()
    job = await api_a.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="1h")
    follower = asyncio.create_task(follow_lag(b_settings, mirrored.topic("ledger"), job.id, lags, stop))

    async def past_kill_point(batch) -> bool:
        return settled(batch) >= KILL_AT * LINES

    at_kill = await wait_batch(api_a, job.id, past_kill_point, 180)
    killed = regions.kill(a)
    (a.state / "files").rename(a.state / "files.lost")  # a's file store is gone with it
    await asyncio.sleep(2)  # what was in flight in b's MirrorMaker 2 lands (the lag follower keeps reading)
    stop.set()
    await follower

    started = time.monotonic()
    [taken, summary] = region_command(b, "failover", "--from", a.cfg.region, "--force")  # a is lost
    assert (taken["batch_id"], taken["epoch"], summary["taken_over"]) == (job.id, 1, 1)

    async def progressed(batch) -> bool:
        return settled(batch) > taken["settled"]

    await wait_batch(api_b, job.id, progressed, RTO_S * 2)
    rto_s = time.monotonic() - started

    async def ended(batch) -> bool:
        return batch.status in ENDED

    done = await wait_batch(api_b, job.id, ended, 300)
    assert done.status == "completed"
    ids = await files_ids(api_b, done)
    assert sorted(ids) == [f"line-{i:04d}" for i in range(LINES)]  # each custom_id exactly once

    survived = await read_topics(b_settings, mirrored, kinds=("ledger",))
    ran_in_a = len(survived.results.get(job.id, {}))
    ran_in_b = LINES - taken["settled"]
    lags.sort()
    p99 = lags[max(0, int(0.99 * len(lags)) - 1)]
    print(
        f"\nmulti-region: {LINES} lines, a killed at {settled(at_kill)} settled ({', '.join(killed)});"
        f" replication lag a->b of the job's ledger over {len(lags)} records: p50 {statistics.median(lags):.3f} s,"
        f" p99 {p99:.3f} s (RPO); failover to resumed progress {rto_s:.1f} s (RTO; the command itself took"
        f" {summary['seconds']} s); executions from what survives: {ran_in_a} settled in a and mirrored,"
        f" {ran_in_b} run in b"
    )
    assert ran_in_a == taken["settled"]  # nothing settled in a and mirrored ran again in b
    assert p99 <= RPO_P99_S
    assert rto_s <= RTO_S

    # a comes back (Kafka on its data, Redis empty, services, its inbound MirrorMaker 2): it drives nothing of the
    # job; once a's mirror of b holds the job's end, a takes the job back and serves the same lines once each
    regions.revive(a)
    settled_in_a, reruns = await _reruns(a, b, job.id)
    assert reruns == settled_in_a - taken["settled"]
    b_topics = JobTopics.mirrored(b.cfg.region)
    async with asyncio.timeout(120):
        while (record := (await read_topics(a_settings, b_topics, kinds=("specs",))).records.get(job.id)) is None or (
            record.status != "completed"
        ):
            await asyncio.sleep(1)
    [back, _] = region_command(a, "failover", "--from", b.cfg.region, "--failback")
    assert (back["batch_id"], back["status"], back["epoch"], back["settled"]) == (job.id, "completed", 2, LINES)
    api_a = client(a)
    again = await api_a.batches.retrieve(job.id)
    assert again.status == "completed"
    assert sorted(await files_ids(api_a, again)) == sorted(ids)
    print(
        f"after a came back: a had settled {settled_in_a} lines, {reruns} of them within the lag, which ran again in b"
        " (reruns); fail-back: a serves the job's 2,000 lines once each"
    )


async def _reruns(a: DevStack, b: DevStack, batch_id: str) -> tuple[int, int]:
    """Once b's mirror of a has copied everything a's ledger holds of the job (a is back): the lines a settled, and
    the lines that ran in both regions as ``llmq region reruns`` in b counts them."""
    settled_in_a = len((await read_topics(a.cfg.settings(), JobTopics(), kinds=("ledger",))).results[batch_id])
    mirrored = JobTopics.mirrored(a.cfg.region)
    async with asyncio.timeout(120):
        while len((await read_topics(b.cfg.settings(), mirrored, kinds=("ledger",))).results[batch_id]) < settled_in_a:
            await asyncio.sleep(1)
    [counts] = region_command(b, "reruns", "--from", a.cfg.region)
    return settled_in_a, counts[batch_id]

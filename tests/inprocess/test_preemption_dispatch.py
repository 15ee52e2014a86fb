"""Preemption end to end through a real broker and Redis: a worker on the transformers engine (llmq-tiny, 2 slots)
whose slots are all held by long deferred generations reports them preemptible; the batcher sends it an interactive
request although no slot is free; the engine preempts one deferred request for it, and every request ends once,
succeeded, the deferred ones with all their tokens. Orders and counts, never timings."""

from __future__ import annotations

import contextlib
import time
import uuid

import msgspec
import pytest

from llmq_core import kafka, wire
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.settings import Settings
from llmq_core.tokenizer import EOS_ID
from tests.inprocess.test_batcher_loop import MODEL, _request
from tests.inprocess.test_prefix_dispatch import _batcher, _clients, _until
from tests.stacks import engine_worker

pytest.importorskip("transformers")

from llmq_worker.engines.tiny_model import build_llmq_tiny  # noqa: E402
from llmq_worker.engines.transformers_engine import TransformersEngine  # noqa: E402

pytestmark = pytest.mark.integration

SLOTS = 2
DEFERRED_TOKENS = 1200  # seconds of decoding on llmq-tiny (its end token banned): running when the person arrives


def _deferred(request_id: str) -> wire.GenerationRequest:
    r = _request(request_id, "pod", deadline_in_ms=3_600_000, prompt=f"long deferred work {request_id}")
    return msgspec.structs.replace(
        r,
        traffic_class="deferred",
        sampling=wire.SamplingParams(max_tokens=DEFERRED_TOKENS, temperature=0.0, logit_bias={EOS_ID: -100.0}),
    )


async def _results(settings: Settings, topic: str, wanted: set[str], timeout_s: float = 600) -> list[wire.FinalResult]:
    """Every FinalResult of ``wanted`` on ``topic`` (one partition: in the order they were produced)."""
    reader = kafka.make_consumer(settings, topic, group_id=None)
    await reader.start()
    results: list[wire.FinalResult] = []
    try:
        await _until_results(reader, results, wanted, timeout_s)
        return results
    finally:
        await reader.stop()


async def _until_results(reader, results: list, wanted: set[str], timeout_s: float) -> None:
    seen: set[str] = set()

    async def more() -> None:
        for records in (await reader.getmany(timeout_ms=200)).values():
            for record in records:
                result = wire.decode(record.value)
                if result.request_id in wanted:
                    results.append(result)
                    seen.add(result.request_id)

    deadline = time.monotonic() + timeout_s
    while seen != wanted:
        assert time.monotonic() < deadline, f"no result for {sorted(wanted - seen)}"
        await more()
    await more()  # a duplicate right behind the last would show here


def _preempting_dispatches(metrics) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith("llmq_batcher_preempting_dispatches_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_worker_full_of_deferred_work_is_sent_an_interactive_request_and_preempts_for_it():
    model, tokenizer = build_llmq_tiny()
    engine = TransformersEngine(model, tokenizer, max_concurrent_sequences=SLOTS, context_window=8192)
    async with _clients() as (settings, tag, names, redis, producer), contextlib.AsyncExitStack() as stack:
        worker_id = f"w-{tag}"
        consumer = kafka.make_consumer(settings, group_id=f"test-preempt-{worker_id}")
        await consumer.start()
        stack.push_async_callback(consumer.stop)
        await stack.enter_async_context(
            engine_worker(engine, worker_id, 0, MODEL, names=names, consumer=consumer, producer=producer, redis=redis)
        )
        run = uuid.uuid4().hex[:8]
        fill = [_deferred(f"{run}-d{i}") for i in range(SLOTS)]
        batch = wire.Batch(
            batch_id=f"fill-{run}",
            worker_id=worker_id,
            model=MODEL,
            requests=fill,
            formed_ms=SYSTEM_CLOCK.now_ms(),
            flush_reason="size",
        )
        loop, metrics = await stack.enter_async_context(_batcher(settings, tag, redis))  # first: it hears the fill
        await kafka.send_message(producer, names.batches_topic, batch, key=batch.batch_id, partition=0)
        view = lambda: loop.policy._fleet.workers.get(worker_id)  # noqa: E731  (the batcher's view of the worker)
        await _until(
            lambda: view() is not None and view().hb_free == 0 and view().hb_preemptible == SLOTS,
            "the batcher never heard the worker full of preemptible deferred work",
        )
        person = f"{run}-person"
        await kafka.send_message(producer, names.request_topics[0], _request(person, "pod", prompt="hello there"))
        await producer.flush()
        results = await _results(settings, names.results_topic, {person, *(r.request_id for r in fill)})

    assert [r.request_id for r in results][0] == person  # it ran before either deferred request ended
    assert len(results) == SLOTS + 1  # each request answered once
    assert {r.request_id: r.outcome for r in results} == dict.fromkeys(
        {r.request_id for r in results}, wire.Outcome.SUCCEEDED
    )
    deferred = [r for r in results if r.request_id != person]
    assert [r.usage.completion_tokens for r in deferred] == [DEFERRED_TOKENS] * SLOTS  # each token counted once
    assert engine.preemption_stats.preemptions == {"interactive": 1} and engine.preemption_stats.resumes == 1
    assert _preempting_dispatches(metrics) == 1

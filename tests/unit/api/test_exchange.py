"""wait_for_resolution: one outcome per request (result, deadline, client gone, shutdown); Cancel only when given up."""

import asyncio

from llmq_api.exchange import wait_for_resolution
from llmq_api.waiters import Abandoned, DeadlineExceeded, WaiterRegistry
from tests.unit.api.fakes import CancelRecorder, Trigger, chunk, final


def start(registry, waiter, deadline, gone, cancels, on_chunk=None):
    return asyncio.create_task(
        wait_for_resolution(
            registry,
            waiter,
            deadline=deadline.wait(),
            client_gone=gone.wait(),
            publish_cancel=cancels,
            on_chunk=on_chunk,
        )
    )


async def test_result_first_no_cancel_and_later_triggers_change_nothing():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=False)
    task = start(registry, waiter, deadline, gone, cancels)
    result = final("r1")
    registry.dispatch(result)
    assert await task is result
    deadline.fire()
    gone.fire()
    await asyncio.sleep(0)
    assert waiter.resolution is result and cancels.cancels == []


async def test_deadline_first_publishes_cancel_and_drops_late_result():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=False)
    task = start(registry, waiter, deadline, gone, cancels)
    deadline.fire()
    assert await task == DeadlineExceeded()
    assert cancels.cancels == [("r1", "deadline_exceeded")]
    assert not registry.dispatch(final("r1"))


async def test_client_gone_publishes_cancel():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=True)
    task = start(registry, waiter, deadline, gone, cancels)
    gone.fire()
    assert await task == Abandoned("client_disconnected")
    assert cancels.cancels == [("r1", "client_disconnected")]
    assert len(registry) == 0


async def test_cancelled_wait_resolves_as_shutdown_and_publishes_cancel():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=False)
    task = start(registry, waiter, deadline, gone, cancels)
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert waiter.resolution == Abandoned("pod_shutdown")
    assert cancels.cancels == [("r1", "pod_shutdown")]


async def test_chunks_reach_the_sink_in_order_before_the_result():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=True)
    seen = []

    async def sink(token_chunk):
        seen.append(token_chunk.text)

    task = start(registry, waiter, deadline, gone, cancels, on_chunk=sink)
    registry.dispatch(chunk("r1", "he", 0))
    registry.dispatch(chunk("r1", "llo", 1))
    registry.dispatch(final("r1", "hello"))
    result = await task
    assert seen == ["he", "llo"] and result.choices[0].text == "hello" and cancels.cancels == []


async def test_failing_sink_counts_as_client_gone():
    registry, cancels, deadline, gone = WaiterRegistry(10), CancelRecorder(), Trigger(), Trigger()
    waiter = registry.register("r1", stream=True)

    async def broken(_chunk):
        raise OSError("connection reset")

    task = start(registry, waiter, deadline, gone, cancels, on_chunk=broken)
    registry.dispatch(chunk("r1", "a", 0))
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(outcome, OSError)
    assert waiter.resolution == Abandoned("client_disconnected")
    assert cancels.cancels == [("r1", "client_disconnected")]

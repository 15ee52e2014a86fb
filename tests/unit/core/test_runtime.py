"""runtime.serve: what every service process does around its loops (start, SIGTERM, drain, close in reverse)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from llmq_core import runtime
from llmq_core.settings import Settings


@pytest.fixture(autouse=True)
def _keep_pytest_logging(monkeypatch):
    monkeypatch.setattr(runtime, "setup_logging", lambda *_: None)  # it replaces the root handlers


class Service:
    """One loop that runs until asked to stop (or ends by itself when ``ends``), and records the order of events."""

    def __init__(self, *, ends: bool = False, ignores_stop: bool = False) -> None:
        self.events: list[str] = []
        self.ends, self.ignores_stop = ends, ignores_stop
        self._stop = asyncio.Event()

    async def build(self, settings, stack: contextlib.AsyncExitStack) -> runtime.Work:
        stack.callback(self.events.append, "first closed")
        stack.callback(self.events.append, "last closed")
        return runtime.Work(tasks=[self.loop()], stop=self.stop, grace_s=0.2, helpers=[self.helper()])

    async def loop(self) -> None:
        self.events.append("serving")
        if not self.ends:
            await self._stop.wait()
            if self.ignores_stop:
                await asyncio.Event().wait()
        self.events.append("loop done")

    async def helper(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append("helper cancelled")
            raise

    def stop(self) -> None:
        self.events.append("stop")
        self._stop.set()


async def _serve_until_serving(service: Service) -> asyncio.Task:
    task = asyncio.create_task(runtime.serve("test", "t-0", service.build, Settings()))
    async with asyncio.timeout(5):
        while "serving" not in service.events:
            await asyncio.sleep(0)
    return task


async def test_sigterm_stops_the_loops_then_closes_what_was_built_in_reverse():
    service = Service()
    task = await _serve_until_serving(service)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, 5)
    assert service.events == ["serving", "stop", "loop done", "helper cancelled", "last closed", "first closed"]


async def test_a_loop_that_ends_by_itself_ends_the_process():
    service = Service(ends=True)
    await asyncio.wait_for(runtime.serve("test", "t-0", service.build, Settings()), 5)
    assert service.events == ["serving", "loop done", "stop", "helper cancelled", "last closed", "first closed"]


async def test_a_loop_past_its_grace_is_cancelled_and_everything_still_closes():
    service = Service(ignores_stop=True)
    task = await _serve_until_serving(service)
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, 5)
    assert service.events[-3:] == ["helper cancelled", "last closed", "first closed"]


async def test_a_helper_that_lost_its_cancel_is_cancelled_again_and_the_process_ends():
    service = Service()

    async def helper() -> None:  # as a loop over Python 3.11's wait_for may: one cancel is lost
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            service.events.append("helper cancelled again")
            raise

    service.helper = helper
    task = await _serve_until_serving(service)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, 5)
    assert service.events[-3:] == ["helper cancelled again", "last closed", "first closed"]


async def test_a_task_deaf_to_every_cancel_is_left_behind_after_the_bound(caplog):
    deaf = asyncio.Event()
    deaf.set()

    async def loop() -> None:
        while deaf.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

    task = asyncio.create_task(loop(), name="deaf")
    await asyncio.sleep(0)  # running, inside its suppress
    await runtime.cancel_and_wait([task], bound_s=0.3)
    assert not task.done() and "left behind: deaf" in caplog.text
    deaf.clear()  # let it end with the test
    task.cancel()
    await task

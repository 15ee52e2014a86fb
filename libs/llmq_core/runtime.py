"""Process plumbing shared by the services: one :func:`serve` (settings, logging, tracing, clients, SIGTERM/SIGINT,
drain, close), the event loop, and the liveness key.

The batcher, the worker and the result-router run under :func:`serve`. The API pod does not: uvicorn owns its event
loop and signals there (``llmq_api.main``), and the pod shares the pieces instead (``make_redis``, :func:`keep_alive`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import msgspec
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from llmq_core import constants, ids, metrics, tracing
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.redis_client import make_redis
from llmq_core.settings import Settings, SettingsError, load_settings
from llmq_core.telemetry import setup_logging

log = logging.getLogger(__name__)

CANCEL_BOUND_S = 5.0  # a task still running this long after its first cancel is left behind (logged)
RECANCEL_S = 0.1  # how often a task that lived through its cancel is cancelled again


@dataclass
class Work:
    """What a built service runs. ``tasks`` run until SIGTERM/SIGINT or until the first of them ends (a loop that dies,
    Redis or Kafka gone for good, ends the process so that its supervisor restarts it); then ``stop()`` asks them to
    finish, within ``grace_s`` (None: they bound their own drain). ``helpers`` (a lag watch) are cancelled after.
    ``liveness``: the Redis on which :func:`keep_alive` refreshes the service's alive key (None: the service does)."""

    tasks: list[Coroutine[Any, Any, Any]]
    stop: Callable[[], None]
    grace_s: float | None
    helpers: list[Coroutine[Any, Any, Any]] = field(default_factory=list)
    liveness: Redis | None = None


class Build(Protocol):
    def __call__(self, settings: Settings, stack: contextlib.AsyncExitStack) -> Awaitable[Work]: ...


def service_settings(*groups: str) -> Settings:
    """The settings a service reads, ``groups`` validated now: a bad value in one of them ends the process at start
    (SystemExit naming each refused variable); one in a group the service does not read is no concern of it."""
    try:
        return load_settings(*groups)
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None


async def serve(service: str, instance_id: str, build: Build, settings: Settings) -> None:
    """Run one service process: logging, tracing, then ``build`` (which starts its clients and pushes how to close them
    on ``stack``), then its :class:`Work` until it is done; what was built is closed in reverse order however it
    ends. ``settings``: from :func:`service_settings`."""
    setup_logging(service, settings.observability.log_level, settings.region.name)
    tracing.configure(service, settings)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(tracing.shutdown)
        work = await build(settings, stack)
        if work.liveness is not None:
            work.helpers.append(keep_alive(work.liveness, service, instance_id, {"pid": os.getpid()}))
        log.info("%s %s started", service, instance_id)
        await _supervise(work)
    log.info("%s %s stopped", service, instance_id)


async def _supervise(work: Work) -> None:
    stop = stop_event()
    tasks = [asyncio.create_task(task) for task in work.tasks]
    helpers = [asyncio.create_task(helper) for helper in work.helpers]
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        work.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), work.grace_s)
    finally:
        await cancel_and_wait([stopped, *helpers])  # before the clients they use are closed


async def cancel_and_wait(tasks: list[asyncio.Task], bound_s: float | None = None) -> None:
    """Cancel ``tasks`` and wait until they have ended, cancelling again every RECANCEL_S any that is still running: a
    cancel can be lost (Python 3.11's ``asyncio.wait_for``, which redis-py uses too, returns a result that arrived with
    the cancel), and a loop then runs on. After ``bound_s`` (default CANCEL_BOUND_S) the rest is left behind, named in
    the log. Their errors are not raised (a stopping owner has no use for them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (CANCEL_BOUND_S if bound_s is None else bound_s)
    pending = {task for task in tasks if not task.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, max(0.0, deadline - loop.time())))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: not reported again when the task is collected
    if pending:
        log.error("still running after their cancel, left behind: %s", ", ".join(t.get_name() for t in pending))


class Client(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def start(stack: contextlib.AsyncExitStack, *clients: Client) -> None:
    """Start Kafka clients in order; each is stopped when ``stack`` closes (the last started first)."""
    for client in clients:
        await client.start()
        stack.push_async_callback(client.stop)


def redis(stack: contextlib.AsyncExitStack, settings: Settings) -> Redis:
    """A client from ``make_redis`` (commands retried), closed when ``stack`` closes."""
    client = make_redis(settings)
    stack.push_async_callback(client.aclose)
    return client


def serve_metrics(
    stack: contextlib.AsyncExitStack, registry: CollectorRegistry, settings: Settings, port: int | None
) -> None:
    """Serve ``registry`` on ``/metrics`` (``port`` None: Settings.observability.metrics_port; 0: off) until ``stack`` closes."""
    stop = metrics.serve(
        registry, settings.observability.metrics_port if port is None else port, settings.observability.metrics_host
    )
    if stop is not None:
        stack.callback(stop)


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main()`` on uvloop when available (plain asyncio otherwise)."""
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def exit_at_once(code: int = 0) -> NoReturn:
    """End a service process that has stopped (its clients closed by :func:`serve`) without the interpreter's teardown:
    logs and standard streams are flushed, then ``os._exit``. Tearing down torch's modules kept a transformers worker
    alive 3 s after it logged its stop, and every test stack's shutdown waited for it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def service_arguments(description: str, settings: Settings) -> argparse.Namespace:
    """The flags every consumer service takes: ``--instance-id`` (default hostname-pid; qualified by the region) and
    ``--metrics-port``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--instance-id", default=f"{socket.gethostname()}-{os.getpid()}")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off; default LLMQ_METRICS_PORT)"
    )
    args = parser.parse_args()
    args.instance_id = regional(args.instance_id, settings)
    return args


def regional(name: str, settings: Settings) -> str:
    """A process's ``name`` qualified by this region (LLMQ_REGION): ``<region>-<name>``, see :func:`ids.instance_id`."""
    return ids.instance_id(settings.region.name, name)


def stop_event() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT: the service then drains and exits."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


async def keep_alive(redis: Redis, service: str, instance: str, info: dict, interval_ms: int = 1000) -> None:
    """Refresh ``alive_key(service, instance)`` (JSON ``info`` + ``sent_ms``) every ``interval_ms`` until cancelled."""
    key = constants.alive_key(service, instance)
    while True:
        payload = msgspec.json.encode({**info, "sent_ms": SYSTEM_CLOCK.now_ms()})
        try:
            await redis.set(key, payload, px=interval_ms * 3)
        except Exception as exc:  # Redis down: keep serving, the key simply expires
            log.warning("liveness update failed: %s", exc)
        await asyncio.sleep(interval_ms / 1000)

"""Process plumbing shared by the services: event loop, SIGTERM/SIGINT, and the liveness key."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable

import msgspec
from redis.asyncio import Redis

from llmq_core import constants
from llmq_core.clock import SYSTEM_CLOCK

log = logging.getLogger(__name__)


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main()`` on uvloop when available (plain asyncio otherwise)."""
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def service_arguments(description: str) -> argparse.Namespace:
    """The flags every consumer service takes: ``--instance-id`` (default hostname-pid) and ``--metrics-port``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--instance-id", default=f"{socket.gethostname()}-{os.getpid()}")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off; default LLMQ_METRICS_PORT)"
    )
    return parser.parse_args()


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

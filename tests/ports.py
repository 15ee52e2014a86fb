"""Ports for the tests' servers: allocated per test run, never fixed, so two runs (or a run beside a dev stack) on one
machine do not collide, and a run's leftovers do not stall the next.

A stack derives several ports from one base (``StackConfig``: Kafka's controller +1, metrics at an API port + 10, a
region's ports base..base+40), so :func:`block` hands out runs of consecutive ports. They come from below the kernel's
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768+ by default), so an outgoing connection never holds
one, and each is checked free (bind on 127.0.0.1) when handed out; blocks never overlap within a run. Under
pytest-xdist each worker process draws from its own slice of that range (``PYTEST_XDIST_WORKER`` gw0, gw1, ...), so
the workers of one run never hand out the same port either.
"""

from __future__ import annotations

import os
import random
import socket
import threading

BLOCK_PORTS = 50  # a whole private stack: Kafka (+0..+2), Redis, API pods, their metrics ports (API + 10...)
LOW_PORT = 20_000
HIGH_PORT = 32_000  # below the ephemeral range


def _slice(worker: str | None, count: str | None) -> tuple[int, int]:
    """This process's share of LOW_PORT..HIGH_PORT: all of it, or the xdist worker's slice."""
    if not worker or not count:
        return LOW_PORT, HIGH_PORT
    width = (HIGH_PORT - LOW_PORT) // int(count)
    low = LOW_PORT + int(worker.removeprefix("gw")) * width
    return low, low + width


_LOW, _HIGH = _slice(os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT"))
_lock = threading.Lock()
_handed_out: list[range] = []
_random = random.Random()  # seeded from the OS: runs side by side draw different bases


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def block(size: int = BLOCK_PORTS) -> int:
    """The first of ``size`` consecutive free ports no other block of this run holds. RuntimeError when none is found
    (the machine's low ports are exhausted)."""
    with _lock:
        for _ in range(1000):
            base = _random.randrange(_LOW, _HIGH - size)
            ports = range(base, base + size)
            if any(max(p.start, ports.start) < min(p.stop, ports.stop) for p in _handed_out):
                continue
            if all(_free(port) for port in ports):
                _handed_out.append(ports)
                return base
    raise RuntimeError(f"no {size} consecutive free ports between {_LOW} and {_HIGH}")

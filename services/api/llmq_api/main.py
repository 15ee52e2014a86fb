"""API pod process: wires settings, logging, the pod and uvicorn (uvloop).

Run: ``python -m llmq_api.main --host 127.0.0.1 --port 8000 [--instance-id api-0] [--metrics-port 9100]``.
Prometheus ``/metrics`` is served apart from the API, on ``--metrics-port`` (LLMQ_METRICS_PORT) bound to
LLMQ_METRICS_HOST (an internal address; loopback by default): never on the port clients reach.
SIGTERM/SIGINT: readiness turns 503 and new generation requests get 503 at once; after ``api.shutdown_delay_ms`` (a load
balancer's time to notice) uvicorn stops accepting connections, lets in-flight requests finish for up to ~80% of
``shutdown_grace_s`` (less if closing the clients needs more of the rest), then exits within the grace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Iterator
from types import FrameType

import uvicorn
from aiokafka.errors import KafkaConnectionError

from llmq_api import connections
from llmq_api.app import create_app
from llmq_api.pod import CLOSE_TIMEOUT_S, REDIS_OP_TIMEOUT_S, Pod
from llmq_core import ids, kafka, metrics, runtime, tracing
from llmq_core.clock import SYSTEM_CLOCK, Clock
from llmq_core.telemetry import setup_logging

# The settings groups an API pod reads (validated at start; a bad value elsewhere is no concern of it)
GROUPS = ("region", "kafka", "redis", "api", "models", "jobs", "result_store", "batcher", "observability", "runtime")

GRACE_SHARE_FOR_REQUESTS = 0.8
CLOSE_BUDGET_S = REDIS_OP_TIMEOUT_S + CLOSE_TIMEOUT_S  # Pod.stop's bounded steps, after the requests' share


class DrainingServer(uvicorn.Server):
    """uvicorn, plus: the first exit signal marks the pod as draining at once, and the listener closes (uvicorn's
    graceful shutdown) ``shutdown_delay_ms`` later, or at once on a second SIGINT."""

    def __init__(
        self,
        config: uvicorn.Config,
        pod: Pod,
        shutdown_delay_ms: int = 0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(config)
        self.pod = pod
        self.shutdown_delay_ms = shutdown_delay_ms
        self.clock = clock
        self.close_at_ms: int | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.close_at_ms is None:
            self.pod.draining = True
            self.close_at_ms = self.clock.now_ms() + self.shutdown_delay_ms
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        exiting = await super().on_tick(counter)
        return exiting and (self.force_exit or self.close_at_ms is None or self.clock.now_ms() >= self.close_at_ms)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                # Drained already: exit with status 0 instead of uvicorn re-raising the signal to die by it.
                self._captured_signals.clear()


def requests_grace_s(shutdown_grace_s: float, shutdown_delay_s: float = 0.0) -> int:
    """Whole seconds in-flight requests get once the listener closes: ~80% of the grace, less the shutdown delay, less
    if closing the clients would then run past it (at least 1)."""
    share_s = min(shutdown_grace_s * GRACE_SHARE_FOR_REQUESTS, shutdown_grace_s - CLOSE_BUDGET_S)
    return max(1, int(share_s - shutdown_delay_s))


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{secrets.token_hex(3)}"


def check_topic_limits(settings) -> None:
    """Refuse to start when a topic's record limit is below what requests need (``kafka.require_topic_limits``). A
    broker that is down is no reason to refuse: the pod serves 503s until it is back, as at any other time."""
    try:
        asyncio.run(kafka.require_topic_limits(settings))
    except KafkaConnectionError as exc:
        logging.getLogger(__name__).warning("topic limits not checked: Kafka unreachable (%s)", exc)


def main() -> None:
    parser = argparse.ArgumentParser(description="llmq API pod")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--instance-id", default=None, help="default: LLMQ_API_INSTANCE_ID, else hostname + random")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus /metrics (default: LLMQ_METRICS_PORT)"
    )
    args = parser.parse_args()
    settings = runtime.service_settings(*GROUPS)
    setup_logging("api", settings.observability.log_level, settings.region.name)
    tracing.configure("api", settings)
    instance_id = ids.instance_id(
        settings.region.name, args.instance_id or settings.api.instance_id or default_instance_id()
    )
    check_topic_limits(settings)
    try:
        pod = Pod(settings, instance_id)
        connection_options = connections.uvicorn_options(settings)
    except ValueError as exc:  # a bad API keys file, proxy list or files URL: refuse to start rather than serve with it
        logging.getLogger(__name__).error("%s", exc)
        raise SystemExit(2) from None
    config = uvicorn.Config(
        create_app(pod),
        host=args.host,
        port=args.port,
        loop="uvloop",
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=requests_grace_s(
            settings.runtime.shutdown_grace_s, settings.api.shutdown_delay_ms / 1000
        ),
        **connection_options,
    )
    port = settings.observability.metrics_port if args.metrics_port is None else args.metrics_port
    stop_metrics = metrics.serve(pod.metrics.registry, port, settings.observability.metrics_host)
    try:
        DrainingServer(config, pod, settings.api.shutdown_delay_ms).run()
    finally:
        if stop_metrics is not None:
            stop_metrics()
        tracing.shutdown()  # export the spans still buffered


if __name__ == "__main__":
    main()

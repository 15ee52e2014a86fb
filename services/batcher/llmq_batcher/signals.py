"""The batcher's inputs beside its request records: worker heartbeats and cancels (Redis pub/sub), the pod watch
(cancels the work of API pods that are gone) and the llmq.results tail (ends the in-flight counts of tenant caps).
Each feeds the policy and wakes the decider; :func:`supervised` keeps any input running across outages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from aiokafka import AIOKafkaConsumer

from llmq_batcher.pods import HeldWork, by_holder
from llmq_batcher.shared import Shared
from llmq_core import constants, wire
from llmq_core.settings import Settings
from llmq_core.stream_log import resumable

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
POD_GONE_REASON = "pod_gone"


async def supervised(read: Callable[[], Awaitable[None]], stopping: asyncio.Event) -> None:
    """Keep an input running across broker or Redis outages until ``stopping``: log, back off, start it again."""
    while not stopping.is_set():
        try:
            await read()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; restarting in %.1f s", read.__name__, RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)


@dataclass(frozen=True)
class PodChecks:
    """Every ``check_ms`` the pods of held requests are looked up; one missing for ``grace_ms`` is gone, and the
    resumable streams it holds are cancelled ``resume_window_ms`` after that."""

    check_ms: int = 1000
    grace_ms: int = 2000
    resume_window_ms: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> PodChecks:
        interval_ms = settings.api.pod_heartbeat_interval_ms
        return cls(interval_ms, 2 * interval_ms, settings.api.stream_resume_window_ms)


class Signals:
    """The input tasks (:meth:`inputs`). ``results``: a consumer of llmq.results for the tail (None: no tail).
    :attr:`announced`: model a worker heartbeat named -> (its context window, when), for the entry checks."""

    def __init__(self, shared: Shared, results: AIOKafkaConsumer | None = None, pods: PodChecks = PodChecks()) -> None:
        self.shared = shared
        self.results = results
        self.pod_check_ms = pods.check_ms
        self.held = HeldWork(pods.grace_ms, pods.resume_window_ms)
        self.announced: dict[str, tuple[int, int]] = {}

    def inputs(self) -> list[Callable[[], Awaitable[None]]]:
        """The tasks to run (each under :func:`supervised`)."""
        return [self.listen, self.watch_pods, *([self.tail_results] if self.results is not None else [])]

    async def listen(self) -> None:
        """Heartbeats and cancels, until stopping."""
        shared = self.shared
        pubsub = shared.redis.pubsub()
        await pubsub.subscribe(shared.names.heartbeats_channel, shared.names.cancels_channel)
        try:
            while not shared.stopping.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                if message is not None:
                    self.on_signal(message["data"])
        finally:
            await pubsub.aclose()

    def on_signal(self, data: bytes) -> None:
        """Take one heartbeat or cancel (anything else is ignored)."""
        try:
            message = wire.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring undecodable signal: %s", exc)
            return
        if isinstance(message, wire.WorkerHeartbeat):
            now_ms = self.shared.clock.now_ms()
            self.shared.policy.on_heartbeat(message, now_ms)
            self.announced[message.model] = (message.context_window, now_ms)
        elif isinstance(message, wire.Cancel):
            self.shared.policy.cancel(message.request_id, message.reason)
        elif isinstance(message, wire.PrefixSummary):
            self.shared.policy.on_prefix_summary(message, self.shared.clock.now_ms())
            return  # changes no room: nothing to decide anew
        else:
            return
        self.shared.wake.set()

    async def watch_pods(self) -> None:
        """Publish a Cancel for every held request of a gone API pod (a resumable stream: of its holder, gone for the
        resume window too): queued ones are answered canceled here (our own cancels subscription), running ones are
        aborted by their worker."""
        shared = self.shared
        while not shared.stopping.is_set():
            await asyncio.sleep(self.pod_check_ms / 1000)
            held = shared.policy.requests_by_pod()
            streams = [r.request_id for requests in held.values() for r in requests if resumable(r)]
            holders = await shared.redis.mget([constants.stream_holder_key(i) for i in streams]) if streams else []
            work = by_holder(held, dict(zip(streams, holders)))
            pods = list(work)
            alive = await shared.redis.mget([constants.pod_key(pod) for pod in pods]) if pods else []
            seen = dict(zip(pods, (v is not None for v in alive)))
            for pod, request_ids in self.held.gone(work, seen, shared.clock.now_ms()):
                log.warning("API pod %s is gone: cancelling its %d requests", pod, len(request_ids))
                async with shared.redis.pipeline(transaction=False) as pipe:
                    for request_id in request_ids:
                        cancel = wire.Cancel(request_id=request_id, reason=POD_GONE_REASON)
                        pipe.publish(shared.names.cancels_channel, wire.encode(cancel))
                    await pipe.execute()

    async def tail_results(self) -> None:
        """Every result of a request held here ends it in the policy (its tenant's in-flight count)."""
        shared = self.shared
        while not shared.stopping.is_set():
            records = await self.results.getmany(timeout_ms=200, max_records=1000)
            for batch in records.values():
                for record in batch:
                    request_id = record.key.decode(errors="replace") if record.key else ""
                    if shared.policy.holds(request_id) and (tenant_id := result_tenant(record)) is not None:
                        shared.policy.on_result(request_id, tenant_id)
            if records:
                shared.wake.set()


class _ResultTenant(msgspec.Struct):
    """What the results tail reads of a FinalResult: its tenant (the rest, up to a MiB of text, is skipped)."""

    tenant_id: str


_TENANT_MSGPACK = msgspec.msgpack.Decoder(_ResultTenant)
_TENANT_JSON = msgspec.json.Decoder(_ResultTenant)


def result_tenant(record) -> str | None:
    """The tenant a record of llmq.results names (read as ``wire.decode`` reads it); None when it names none: such a
    record settles nothing."""
    try:
        value = record.value or b""
        decoder = _TENANT_JSON if wire.is_json(value, wire.content_type_of(record.headers)) else _TENANT_MSGPACK
        return decoder.decode(value).tenant_id
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None

"""Who holds which prompt prefix: per live worker, the prefix-chain hashes (llmq_core.prefixes) its cache holds, as its
last :class:`~llmq_core.wire.PrefixSummary` said, and those of the requests this batcher sent it since.

A summary replaces that worker's last one and counts for ``ttl_ms`` after it arrives; a lost one costs affinity until
the next, a stale one (not renewed within the TTL) is dropped, and one older than the last taken (``sent_ms``: the
worker's clock, compared only with its own) is ignored. What this batcher dispatched counts at once, so that the next
requests of a batch job or chat session follow the first before the worker's next summary names them, and for
``ttl_ms`` from dispatch. Wrong either way, a hash only moves a batch to another worker with room: it never decides
whether a request runs. The fleet forgets a worker it removes here (:meth:`forget`).

Bound: per worker, ``max_summary_blocks`` hashes of its summary (about 68 bytes each in CPython: a frozenset slot and
its int) and ``max_sent_blocks`` of dispatches (about 120: an OrderedDict entry); at the defaults at most
WORKER_MAX_BYTES (390 KiB measured, tests/unit/batcher/test_prefix_index.py), 40 MiB for 100 workers. Only workers the
fleet has live are held. Pure: time enters only as ``now_ms``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

from llmq_core import wire
from llmq_core.constants import PREFIX_BLOCK_BYTES

MAX_SUMMARY_BLOCKS = 4096  # hashes taken from one summary (its first: the most recently used)
MAX_SENT_BLOCKS = 1024  # hashes of this batcher's own dispatches kept per worker (the oldest go first)
WORKER_MAX_BYTES = 512 * 1024  # memory of one worker's hashes at the defaults, at most


class _Held:
    """One worker's hashes: ``summary`` until ``summary_until_ms``; ``sent``: hash -> until when (oldest first)."""

    __slots__ = ("model", "tenant_scoped", "summary", "summary_sent_ms", "summary_until_ms", "sent")

    def __init__(self, model: str, tenant_scoped: bool = True) -> None:
        self.model = model
        self.tenant_scoped = tenant_scoped
        self.summary: frozenset[int] = frozenset()
        self.summary_sent_ms = -1
        self.summary_until_ms = 0
        self.sent: OrderedDict[int, int] = OrderedDict()

    def matched(self, chain: tuple[int, ...], now_ms: int) -> int:
        """Leading blocks of ``chain`` held at ``now_ms`` (a chain matches only as a prefix)."""
        summary = self.summary if self.summary_until_ms > now_ms else frozenset()
        sent, count = self.sent, 0
        for block in chain:
            if block not in summary and sent.get(block, 0) <= now_ms:
                break
            count += 1
        return count

    def drop_expired(self, now_ms: int) -> None:
        if self.summary_until_ms <= now_ms:
            self.summary = frozenset()
        sent = self.sent
        while sent and next(iter(sent.values())) <= now_ms:
            sent.popitem(last=False)

    def empty(self) -> bool:
        return not self.summary and not self.sent


class PrefixIndex:
    """The hashes each live worker holds, by worker id. ``ignored`` counts summaries not taken, by reason:
    ``block_bytes`` (another block size than PREFIX_BLOCK_BYTES: its hashes mean other prefixes), ``unknown_worker``
    (not live in the fleet, or for another model than it serves), ``out_of_order`` (older than the last taken)."""

    __slots__ = ("ttl_ms", "max_summary_blocks", "max_sent_blocks", "ignored", "_workers", "_next_sweep_ms")

    def __init__(
        self, ttl_ms: int, max_summary_blocks: int = MAX_SUMMARY_BLOCKS, max_sent_blocks: int = MAX_SENT_BLOCKS
    ) -> None:
        self.ttl_ms = ttl_ms
        self.max_summary_blocks = max_summary_blocks
        self.max_sent_blocks = max_sent_blocks
        self.ignored: Counter[str] = Counter()
        self._workers: dict[str, _Held] = {}
        self._next_sweep_ms = 0

    def summary(self, message: wire.PrefixSummary, live_model: str | None, now_ms: int) -> bool:
        """Take a summary received at ``now_ms`` from a worker the fleet has live for ``live_model`` (None: not live).
        Returns whether it was taken (else it is counted in ``ignored``)."""
        if message.block_bytes != PREFIX_BLOCK_BYTES:
            self.ignored["block_bytes"] += 1
            return False
        if live_model is None or live_model != message.model:
            self.ignored["unknown_worker"] += 1
            return False
        held = self._held(message.worker_id, message.model)
        if message.sent_ms < held.summary_sent_ms:
            self.ignored["out_of_order"] += 1
            return False
        if held.tenant_scoped != message.tenant_scoped:  # what we sent it was hashed in the other scope
            held.tenant_scoped, held.sent = message.tenant_scoped, OrderedDict()
        held.summary = frozenset(message.blocks[: self.max_summary_blocks])
        held.summary_sent_ms, held.summary_until_ms = message.sent_ms, now_ms + self.ttl_ms
        return True

    def dispatched(self, worker_id: str, model: str, chains: Iterable[tuple[int, ...]], now_ms: int) -> None:
        """The requests of ``chains`` (hashed in :meth:`tenant_scoped` of the worker) were just sent to ``worker_id``:
        it holds their prefixes from now for ``ttl_ms``."""
        sent, until_ms = self._held(worker_id, model).sent, now_ms + self.ttl_ms
        for chain in chains:
            for block in chain:
                sent[block] = until_ms
                sent.move_to_end(block)
        while len(sent) > self.max_sent_blocks:
            sent.popitem(last=False)

    def tenant_scoped(self, worker_id: str) -> bool:
        """Whether ``worker_id``'s hashes are salted by tenant (as its last summary said; True before any)."""
        held = self._workers.get(worker_id)
        return held.tenant_scoped if held is not None else True

    def matched(self, worker_id: str, chain: tuple[int, ...], now_ms: int) -> int:
        """How many leading blocks of ``chain`` ``worker_id`` holds at ``now_ms``."""
        held = self._workers.get(worker_id)
        return held.matched(chain, now_ms) if held is not None else 0

    def forget(self, worker_id: str) -> None:
        """The fleet removed ``worker_id`` (silent, or moved to another model or partition)."""
        self._workers.pop(worker_id, None)

    def expire(self, now_ms: int) -> None:
        """Free what expired by ``now_ms`` (at most once per quarter TTL: :meth:`matched` ignores it anyway)."""
        if now_ms < self._next_sweep_ms:
            return
        self._next_sweep_ms = now_ms + max(self.ttl_ms // 4, 1)
        for worker_id, held in list(self._workers.items()):
            held.drop_expired(now_ms)
            if held.empty():
                del self._workers[worker_id]

    def blocks(self) -> int:
        """Hashes held, every worker together (each worker's summary and dispatches counted apart)."""
        return sum(len(h.summary) + len(h.sent) for h in self._workers.values())

    def _held(self, worker_id: str, model: str) -> _Held:
        held = self._workers.get(worker_id)
        if held is None or held.model != model:
            held = self._workers[worker_id] = _Held(model, held.tenant_scoped if held is not None else True)
        return held

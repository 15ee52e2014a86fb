"""What the batcher reads of the API pods' unfinished requests (``llmq:unfinished``, wire.PodUnfinished): per model,
its share of the requests the pods admitted and have not ended, so the policy can tell whether more of a model's
requests are on their way (load) or the one it holds is alone (light load)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import msgspec

POD_STALE_MS = 1000  # pods report every 100 ms: an older report is from a pod that stopped
BATCHER_STALE_MS = 3000  # batchers report their saturation every second: an older report is from one that is gone


class _Unfinished(msgspec.Struct):
    """What is read of a wire.PodUnfinished (its tag and instance id are skipped)."""

    sent_ms: int
    models: dict[str, dict[str, int]] = {}


class _Sent(msgspec.Struct):
    """What is read of a wire.BatcherSaturation: when it was sent."""

    sent_ms: int


_UNFINISHED = msgspec.msgpack.Decoder(_Unfinished)
_SENT = msgspec.msgpack.Decoder(_Sent)


def unfinished_share(pods: Mapping[bytes, bytes], batchers: Mapping[bytes, bytes], now_ms: int) -> dict[str, int]:
    """Model -> the unfinished requests of the pods that reported within POD_STALE_MS of ``now_ms`` (``pods``: the
    ``llmq:unfinished`` hash), divided among the batchers that reported within BATCHER_STALE_MS (``batchers``: the
    saturation hash; at least this one), rounded up: each batcher reads about its share of them."""
    totals: Counter[str] = Counter()
    for report in _fresh(pods.values(), _UNFINISHED, now_ms, POD_STALE_MS):
        for model, by_class in report.models.items():
            totals[model] += sum(by_class.values())
    share = max(len(_fresh(batchers.values(), _SENT, now_ms, BATCHER_STALE_MS)), 1)
    return {model: -(-count // share) for model, count in totals.items()}


def _fresh(values: Iterable[bytes], decoder: msgspec.msgpack.Decoder, now_ms: int, stale_ms: int) -> list:
    """The reports among ``values`` sent within ``stale_ms`` of ``now_ms``; unreadable ones are skipped."""
    reports = []
    for value in values:
        try:
            report = decoder.decode(value)
        except msgspec.DecodeError:  # also a validation error: not ours to clean up (the API pods delete garbage)
            continue
        if now_ms - report.sent_ms <= stale_ms:
            reports.append(report)
    return reports

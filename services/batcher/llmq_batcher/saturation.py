"""The batcher's admission signal for API pods (``wire.BatcherSaturation`` in Redis ``llmq:saturation``).

Per model and priority class: queue depth and oldest queued age; per model: live workers, their slots and the last
worker heartbeat. Only models of the catalogue or with a worker are reported: a model name made up by a Kafka producer
has no worker, so it cannot grow the report (its requests still count in the all-models ``classes``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from llmq_core import wire
from llmq_batcher.policy import ClassLoad, ModelState


def saturation_report(batcher_id: str, started_ms: int, now_ms: int, load: Mapping[str, ClassLoad],
                      models: Mapping[str, ModelState], catalogue: Collection[str]) -> wire.BatcherSaturation:
    """The report sent at ``now_ms`` by a batcher started at ``started_ms``; ``load``: all models together."""
    return wire.BatcherSaturation(
        batcher_id=batcher_id, sent_ms=now_ms, started_ms=started_ms, classes=_queues(load),
        models={name: wire.ModelLoad(classes=_queues(state.classes), workers=state.workers, slots=state.slots,
                                     worker_seen_ms=state.worker_seen_ms)
                for name, state in models.items() if name in catalogue or state.worker_seen_ms})


def _queues(load: Mapping[str, ClassLoad]) -> dict[str, wire.QueueLoad]:
    return {key: wire.QueueLoad(depth=c.depth, oldest_age_ms=c.oldest_age_ms) for key, c in load.items()}

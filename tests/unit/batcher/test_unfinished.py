"""The batcher's share of the API pods' unfinished requests, per model (llmq_batcher.unfinished)."""

from llmq_batcher.unfinished import unfinished_share
from llmq_core import wire
from tests.unit.batcher.helpers import T0


def pod(name: str, sent_ms: int, **models: dict[str, int]) -> tuple[bytes, bytes]:
    return name.encode(), wire.encode(wire.PodUnfinished(instance_id=name, sent_ms=sent_ms, models=models))


def batcher(name: str, sent_ms: int) -> tuple[bytes, bytes]:
    return name.encode(), wire.encode(wire.BatcherSaturation(batcher_id=name, sent_ms=sent_ms))


def test_fresh_pods_are_summed_per_model_over_their_classes():
    pods = dict(
        [
            pod("api-0", T0 - 50, **{"llmq-sim": {"interactive:paid": 30, "near_interactive": 2}}),
            pod("api-1", T0 - 900, **{"llmq-sim": {"interactive:paid": 32}, "llmq-tiny": {"interactive:free": 1}}),
            pod("api-gone", T0 - 1001, **{"llmq-sim": {"interactive:paid": 500}}),
            (b"garbage", b"\x00not msgpack"),
        ]
    )
    assert unfinished_share(pods, {}, T0) == {"llmq-sim": 64, "llmq-tiny": 1}


def test_each_live_batcher_reads_its_share_rounded_up():
    pods = dict([pod("api-0", T0, **{"llmq-sim": {"interactive:paid": 63}})])
    batchers = dict([batcher("b-0", T0 - 500), batcher("b-1", T0 - 2999), batcher("b-gone", T0 - 3001)])
    assert unfinished_share(pods, batchers, T0) == {"llmq-sim": 32}
    assert unfinished_share({}, batchers, T0) == {}

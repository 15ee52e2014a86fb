"""ModelCatalog: built-ins always, heartbeat models while recently seen."""

from llmq_api.catalog import ModelCatalog
from llmq_core import wire
from llmq_core.clock import FakeClock
from tests.builders import heartbeat


def beat(model: str, context_window: int) -> wire.WorkerHeartbeat:
    return heartbeat(model, max_slots=4, context_window=context_window)


def test_builtins_and_seen_models_with_context_windows():
    clock = FakeClock()
    catalog = ModelCatalog(clock, seen_ttl_ms=1000)
    assert set(catalog.context_windows()) == {"llmq-sim", "llmq-tiny", "smollm2-135m-instruct"}
    catalog.observe(beat("qwen-0.5b", 32768))
    catalog.observe(beat("llmq-sim", 1))  # a heartbeat never shrinks a built-in's spec
    assert catalog.context_windows() == {
        "llmq-sim": 8192,
        "llmq-tiny": 8192,
        "smollm2-135m-instruct": 8192,
        "qwen-0.5b": 32768,
    }
    listing = {m["id"]: m for m in catalog.listing()}
    assert listing["qwen-0.5b"] == {
        "id": "qwen-0.5b",
        "object": "model",
        "created": 0,
        "owned_by": "llmq",
        "context_window": 32768,
    }
    clock.advance(1001)
    assert "qwen-0.5b" not in catalog.context_windows()


def test_heard_ms_is_when_each_models_last_heartbeat_arrived():
    clock = FakeClock(1_000)
    catalog = ModelCatalog(clock)
    catalog.observe(beat("my-llama", 0))
    clock.advance(500)
    assert catalog.heard_ms() == {"my-llama": 1_000}

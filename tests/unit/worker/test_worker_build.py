"""WorkerLoop.build: the core and loop the worker process, the tracing bench and the test stacks all make."""

from llmq_core.clock import FakeClock
from llmq_core.settings import Settings
from llmq_worker.engines.simulated import SimulatedEngine
from llmq_worker.loop import WorkerLoop
from tests.fakes import FakeConsumer, FakeProducer, FakeRedis


def build(**options) -> WorkerLoop:
    engine = SimulatedEngine(max_batch_size=8, batch_time_ms=10)
    settings = Settings(worker={"heartbeat_interval_ms": 100}, runtime={"shutdown_grace_s": 3})
    clients = FakeConsumer(), FakeProducer(log=[]), FakeRedis(log=[])
    return WorkerLoop.build(engine, *clients, settings, worker_id="w1", partition=2, model="llmq-sim", **options)


def test_the_core_serves_the_given_worker_partition_and_model_on_the_loops_clock():
    clock = FakeClock(1_000)
    loop = build(clock=clock)
    assert (loop.core.worker_id, loop.core.partition, loop.core.model) == ("w1", 2, "llmq-sim")
    assert loop.core._clock is clock and loop._clock is clock


def test_heartbeat_and_grace_come_from_the_settings_and_pending_is_four_times_the_engines_slots_by_default():
    loop = build()
    assert (loop._heartbeat_interval_ms, loop._shutdown_grace_s, loop._max_pending) == (100, 3, 32)
    assert build(max_pending=5)._max_pending == 5


def test_llmq_sim_and_the_worker_loop_need_no_torch_or_transformers():
    """The `llmq` image (API pods, batchers, routers, llmq-sim workers) has neither: its sim worker must start and
    answer a structured request without them (llmq-sim's schema instances need no tokenizer)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules.update(torch=None, transformers=None)\n"
        "from llmq_worker.engines.simulated import SimulatedEngine\n"
        "from llmq_worker.grammars import minimal_answer\n"
        "import llmq_worker.loop, llmq_worker.main\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]

"""The bench's batch counters are read until the batcher's once-a-second flush has counted what was served."""

from llmq_bench import loadgen


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_the_delta_waits_for_the_served_requests_to_be_counted():
    clock = _Clock()
    reads = iter([(10, 100), (11, 130), (12, 160)])  # the last second's batches land on the third read
    assert loadgen.batch_delta(lambda: next(reads), (10, 100), 60, sleep=clock.sleep, clock=clock) == (2, 60)


def test_the_delta_gives_up_at_its_timeout_with_what_was_counted():
    clock = _Clock()
    delta = loadgen.batch_delta(lambda: (11, 130), (10, 100), 60, timeout_s=1.0, sleep=clock.sleep, clock=clock)
    assert delta == (1, 30) and clock.now_s >= 1.0

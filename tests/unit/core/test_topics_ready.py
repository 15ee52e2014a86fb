"""A consumer subscribing to a topic its metadata does not show ready leaves it unassigned until its next metadata
refresh (aiokafka: 5 min): topic creation and the consuming services wait until every partition has a leader."""

import pytest

from llmq_core.kafka import await_ready, topics_not_ready

LEADER_NOT_AVAILABLE, TOPIC_AUTHORIZATION_FAILED = 5, 29


def topic(name: str, error_code: int = 0, leaders: tuple[int, ...] = (1,)) -> dict:
    partitions = [{"error_code": 0, "partition": i, "leader": leader} for i, leader in enumerate(leaders)]
    return {"error_code": error_code, "topic": name, "partitions": partitions}


@pytest.mark.parametrize(
    ("described", "pending"),
    [
        ([topic("a"), topic("b", leaders=(1, 1))], []),
        ([topic("a", LEADER_NOT_AVAILABLE, leaders=())], ["a"]),  # created a moment ago
        ([topic("a", TOPIC_AUTHORIZATION_FAILED, leaders=())], ["a"]),  # its ACL has not reached the broker yet
        ([topic("a", leaders=(1, -1)), topic("b")], ["a"]),  # one partition without a leader
        ([topic("b", leaders=())], ["b"]),  # no partitions at all
    ],
)
def test_a_topic_is_ready_when_every_partition_has_a_leader(described, pending):
    assert topics_not_ready(described) == pending


class Admin:
    """Metadata answers in order: the topic without a leader, then with one."""

    def __init__(self, *answers: list[dict]) -> None:
        self.answers = list(answers)

    async def describe_topics(self, topics: list[str]) -> list[dict]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


async def test_waiting_returns_once_the_leader_is_there():
    admin = Admin([topic("a", LEADER_NOT_AVAILABLE, leaders=())], [topic("a")])
    await await_ready(admin, ["a"], timeout_s=30, raise_on_timeout=True)
    assert len(admin.answers) == 1  # asked until ready, and no more


async def test_a_topic_never_ready_raises_for_creation_and_is_logged_for_a_consumer(caplog):
    admin = Admin([topic("a", leaders=(-1,))])
    with pytest.raises(TimeoutError, match="a"):
        await await_ready(admin, ["a"], timeout_s=0, raise_on_timeout=True)
    await await_ready(admin, ["a"], timeout_s=0, raise_on_timeout=False)
    assert "without a leader or not authorized after 0 s: a" in caplog.text

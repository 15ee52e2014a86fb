"""docs/security.md's role table, generated from the ACL table the code applies (:mod:`llmq_core.security`):
``python -m llmq_core.security_doc [PATH]`` rewrites the block between its markers (default: docs/security.md under the
current directory); tests/unit/core/test_security_doc.py checks it, so the page and the ACLs cannot disagree."""

from __future__ import annotations

import sys
from pathlib import Path

from llmq_core import security
from llmq_core.security import DESCRIBE_CONFIGS, GROUP, OPERATION_NAMES, READ, WRITE, KafkaAcl

DEFAULT_PATH = Path("docs/security.md")
COMMAND = "python -m llmq_core.security_doc"
BEGIN = f"<!-- role table: generated from llmq_core.security by `{COMMAND}`; edit the table there -->"
END = "<!-- end of role table -->"

# The names the table stands for: a reply-topic prefix, a Kafka-direct producer, a peer region
REPLY, PRODUCER, PEER = "<reply prefix>", "P", "<peer>"
ROWS = (
    security.ROLE_API,
    security.ROLE_BATCHER,
    security.ROLE_WORKER,
    security.ROLE_ROUTER,
    security.ROLE_MM2,
    PRODUCER,
)
LEGEND = f"""`{REPLY}`: each of `LLMQ_KAFKA_REPLY_TOPIC_PREFIXES` (the router writes every producer's too); `{PRODUCER}`: a
Kafka-direct producer's principal (`LLMQ_KAFKA_INGRESS`), which reads the reply topics its grant binds it to, else
those of the shared prefixes; `{PEER}`: each peer region (`LLMQ_REGION_PEERS`; MirrorMaker 2 and the peers' rows
exist only on a cluster with peers); `*`: every name it prefixes. `admin` is a super user: the only principal that
creates topics (`llmq topics`, `llmq dev create-topic`) and ACLs."""


def _names(acls: list[KafkaAcl]) -> str:
    return ", ".join(f"`{a.name}{'*' if a.prefixed else ''}`" for a in acls) or "nothing"


def _other(acls: list[KafkaAcl]) -> str:
    """The operations beyond reading and writing (DescribeConfigs, on every topic row, is said once below the table)."""
    parts = []
    for operation, name in OPERATION_NAMES.items():
        if operation in (READ, WRITE, DESCRIBE_CONFIGS):
            continue
        rows = [a for a in acls if a.operation == operation]
        topics, groups = [a for a in rows if a.resource != GROUP], [a for a in rows if a.resource == GROUP]
        parts += [f"{name} {_names(topics)}"] if topics else []
        parts += [f"{name} group {_names(groups)}"] if groups else []
    return "; ".join(parts)


def _redis(role: str) -> tuple[str, str]:
    rules = security.REDIS_ROLES.get(role)
    if rules is None:
        return "no Redis user", ""
    return _names_of(rules.subscribe), _names_of(rules.publish)


def _names_of(channels: tuple[str, ...]) -> str:
    return ", ".join(f"`{c}`" for c in channels) or "nothing"


def render() -> str:
    """The block between the markers: the table, one row per role, and its legend."""
    acls = security.kafka_acls((REPLY,), (PRODUCER,), (PEER,))
    lines = [
        BEGIN,
        "| role (Kafka principal = Redis user) | Kafka: reads | Kafka: writes | Kafka: groups it reads in | Kafka: "
        "also | Redis: subscribes | Redis: publishes |",
        "|---|---|---|---|---|---|---|",
    ]
    for role in ROWS:
        own = [a for a in acls if a.principal == role]
        topics = [a for a in own if a.resource != GROUP]
        reads = _names([a for a in topics if a.operation == READ])
        writes = _names([a for a in topics if a.operation == WRITE])
        groups = _names([a for a in own if a.resource == GROUP and a.operation == READ])
        subscribes, publishes = _redis(role)
        lines.append(f"| `{role}` | {reads} | {writes} | {groups} | {_other(own)} | {subscribes} | {publishes} |")
    lines += ["| `admin` | super user | super user | super user | super user | everything | everything |", ""]
    return "\n".join([*lines, LEGEND, END])


def rewrite(page: str) -> str:
    """``page`` with its role-table block replaced by :func:`render`'s; ValueError when it has no block."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no role table between {BEGIN!r} and {END!r}")
    return page[:start] + render() + page[end + len(END) :]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

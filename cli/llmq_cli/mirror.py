"""MirrorMaker 2 (Apache Kafka's ``connect-mirror``, dedicated mode) between the Kafka clusters of two regions.

Decisions (docs/operations/multi-region.md):
- ``DefaultReplicationPolicy``: a remote topic is named ``<source region>.<topic>`` (region a's ``llmq.jobs.ledger`` is
  ``a.llmq.jobs.ledger`` in region b). Flows run both ways, and the prefix keeps them from looping and tells a reader
  where each record was born. Cluster aliases are the regions (``Settings.region.name``).
- MirrorMaker 2 runs in the TARGET region (``--clusters <target>`` runs only the flows into it), so losing a region
  does not lose the peer's inbound mirror.
- Mirrored: the batch-job topics ``llmq.jobs.*`` and ``llmq.results``; nothing of the interactive request path.

:func:`mirror_properties` is the one properties file both regions' MirrorMaker 2 processes read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from llmq_cli.kafka_dist import java_command
from llmq_core import constants, security

# Topics each region's MirrorMaker 2 copies to the other (a full match of each topic name).
MIRRORED_TOPICS = "|".join((re.escape(constants.TOPIC_JOBS_PREFIX) + ".*", re.escape(constants.TOPIC_RESULTS)))
# Consumer groups whose committed offsets are checkpointed (translated into the peer's offsets): llmq's own.
CHECKPOINTED_GROUPS = "llmq-.*"
# MirrorMaker 2's defaults, for production: topics and groups are noticed every 600 s, checkpoints every 60 s.
PRODUCTION_INTERVALS_S = {"refresh.topics": 600, "refresh.groups": 600, "emit.checkpoints": 60}
# Tests: a topic created during the test is replicated within seconds, checkpoints follow within seconds.
TEST_INTERVALS_S = {"refresh.topics": 5, "refresh.groups": 5, "emit.checkpoints": 5}
# Internal topics of a single-node cluster cannot have more than one replica.
_REPLICATION_FACTORS = (
    "replication.factor",
    "checkpoints.topic.replication.factor",
    "heartbeats.topic.replication.factor",
    "offset-syncs.topic.replication.factor",
    "offset.storage.replication.factor",
    "status.storage.replication.factor",
    "config.storage.replication.factor",
)


@dataclass(frozen=True)
class MirrorCluster:
    """One region's Kafka cluster as MirrorMaker 2 reaches it. ``sasl_password`` and ``ca``: secure clusters
    (SASL_SSL, SCRAM-SHA-512 as principal ``mm2``); empty: PLAINTEXT."""

    region: str
    bootstrap: str
    sasl_password: str = ""
    ca: Path | None = None

    def client_properties(self) -> dict[str, str]:
        if not self.sasl_password:
            return {}
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required"
            f' username="{security.ROLE_MM2}" password="{self.sasl_password}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }


@dataclass(frozen=True)
class MirrorOptions:
    """How often MirrorMaker 2 looks for new topics and groups and emits checkpoints (seconds; see
    :data:`PRODUCTION_INTERVALS_S`), and the replication factor of its topics (1: single-node dev clusters)."""

    intervals_s: dict[str, int] = field(default_factory=lambda: dict(PRODUCTION_INTERVALS_S))
    replication_factor: int = 1


def mirror_properties(a: MirrorCluster, b: MirrorCluster, options: MirrorOptions = MirrorOptions()) -> str:
    """MirrorMaker 2's properties for two regions with flows both ways (a->b and b->a); each region runs
    ``MirrorMaker <file> --clusters <itself>``, which runs the flow into it only."""
    props: dict[str, str] = {"clusters": f"{a.region}, {b.region}"}
    for cluster in (a, b):
        props[f"{cluster.region}.bootstrap.servers"] = cluster.bootstrap
        props |= {f"{cluster.region}.{key}": value for key, value in cluster.client_properties().items()}
        # records up to llmq's record limit pass (the producer's default request is 1 MiB)
        props[f"{cluster.region}.producer.max.request.size"] = str(constants.KAFKA_MAX_MESSAGE_BYTES)
    for source, target in ((a, b), (b, a)):
        flow = f"{source.region}->{target.region}"
        props |= {
            f"{flow}.enabled": "true",
            f"{flow}.topics": MIRRORED_TOPICS,
            f"{flow}.groups": CHECKPOINTED_GROUPS,
        }
    props |= {
        "replication.policy.class": "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
        "replication.policy.separator": ".",
        "emit.offset-syncs.enabled": "true",
        "emit.checkpoints.enabled": "true",
        "emit.heartbeats.enabled": "true",
        "sync.group.offsets.enabled": "false",  # each region's own groups keep their own offsets
        "sync.topic.acls.enabled": "false",  # ACLs are each region's own (llmq_core.security), not copied
        **{f"{name}.interval.seconds": str(seconds) for name, seconds in options.intervals_s.items()},
        **{name: str(options.replication_factor) for name in _REPLICATION_FACTORS},
    }
    return "".join(f"{key} = {value}\n" for key, value in props.items())


MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"


def mirror_argv(libs: Path, properties: Path, log4j: Path, target_region: str) -> list[str]:
    """The command that runs the flows into ``target_region`` (the properties file before ``--clusters``: the flag
    would take it as a second cluster name otherwise)."""
    return java_command(
        libs,
        f"-Dlog4j2.configurationFile={log4j}",
        MAIN_CLASS,
        str(properties),
        "--clusters",
        target_region,
    )

"""Who may do what on Kafka and Redis: one principal (Kafka) and one ACL user (Redis) per service role, and the
least-privilege rules of each, as tables. ``llmq dev up --secure`` and operators apply what is generated here
(docs/security.md: the trust model).

The rules follow what the code reads and writes:
- api: produces requests (llmq_api.pod) and what a batch job's create and cancel write to the job log (its record
  on llmq.jobs.specs, its lines on llmq.jobs.lines; llmq_jobs.joblog): never the owners or ledger topics, which only
  routers (and the admin's ``llmq region``) write; subscribes its replies channel and heartbeats, publishes cancels.
- batcher: consumes requests and ingress topics (group llmq-batcher) and llmq.results (no group: finished work);
  produces batches, its own outcomes to llmq.results, dead letters; subscribes heartbeats and cancels, publishes
  cancels and replies (requests it refuses).
- worker: consumes its llmq.batches partition (group llmq-worker-<n>; ACLs are per topic); produces llmq.results and
  dead letters; subscribes cancels, publishes heartbeats and replies.
- router: consumes llmq.results (group llmq-result-router); produces reply topics (under the allowed prefixes),
  batch-job lines to llmq.requests.deferred, dead letters, every job topic; publishes replies.
- Kafka-direct producer P: writes llmq.ingress.P; reads its reply topics (under its prefixes) in group P.
- router, multi-region: also consumes each peer region's mirrored ``<peer>.llmq.results`` (group
  llmq-result-router-peers) and reads ``<peer>.llmq.jobs.owners`` (no group: fencing of batch jobs) and
  ``<peer>.llmq.jobs.specs`` / ``.ledger`` (no group: its view of the jobs moved to the peer).
- admin: super user, used only by ``llmq topics`` / ``llmq dev create-topic`` and operators.
- mm2: MirrorMaker 2 (docs/operations/multi-region.md), on every cluster of a region with peers: as the source of a flow it
  reads llmq.jobs.* and llmq.results and describes llmq's groups (checkpoints); as the target it creates and writes
  the ``<peer>.``-prefixed remote topics (and their configs) and its own topics (``mm2-*``, heartbeats), in the
  Connect group ``<peer>-mm2``. No other topic, no cluster-wide right.
Every Kafka role may also read its topics' configuration (``kafka.require_topic_limits`` at start).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmq_core import constants
from llmq_core.kafka import make_admin, reply_topic_prefixes
from llmq_core.settings import IngressGrant, Settings

ROLE_API = "api"
ROLE_BATCHER = "batcher"
ROLE_WORKER = "worker"
ROLE_ROUTER = "router"
ROLE_ADMIN = "admin"
ROLE_MM2 = "mm2"
ROLES = (ROLE_API, ROLE_BATCHER, ROLE_WORKER, ROLE_ROUTER, ROLE_ADMIN, ROLE_MM2)
SERVICE_ROLES = {"api": ROLE_API, "batcher": ROLE_BATCHER, "worker": ROLE_WORKER, "result-router": ROLE_ROUTER}
KAFKA_BROKER_PRINCIPAL = "llmq-broker"  # the broker's own certificate (controller and inter-broker listener)

# Kafka protocol codes (org.apache.kafka.common.acl / resource)
TOPIC, GROUP = 2, 3
LITERAL, PREFIXED = 3, 4
READ, WRITE, CREATE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS = 3, 4, 5, 7, 8, 10, 11
ALLOW = 3
OPERATION_NAMES = {
    READ: "Read",
    WRITE: "Write",
    CREATE: "Create",
    ALTER: "Alter",
    DESCRIBE: "Describe",
    DESCRIBE_CONFIGS: "DescribeConfigs",
    ALTER_CONFIGS: "AlterConfigs",
}
# MirrorMaker 2's own topics: Connect's mm2-offsets/-configs/-status.<source>.internal, mm2-offset-syncs.<target>.internal
MM2_TOPIC_PREFIX = "mm2-"
MM2_HEARTBEATS_TOPIC = constants.TOPIC_MM2_HEARTBEATS


@dataclass(frozen=True, slots=True)
class KafkaAcl:
    """Allow ``principal`` (a role name) ``operation`` on a topic or group named ``name`` (or every one it prefixes)."""

    principal: str
    resource: int
    name: str
    operation: int
    prefixed: bool = False

    def describe(self) -> str:
        kind = "topic" if self.resource == TOPIC else "group"
        return (
            f"User:{self.principal} {OPERATION_NAMES[self.operation]} {kind} {self.name}{'*' if self.prefixed else ''}"
        )


# The ACL table: plain data that ``llmq dev up --secure`` and ``llmq topics --acls`` (the Helm chart's hook) apply and
# docs/security.md's role table is generated from (llmq_core.security_doc). role -> (topic, prefixed, operations);
# DescribeConfigs is added to every topic row.
TopicRow = tuple[str, bool, tuple[int, ...]]
KAFKA_TOPICS: dict[str, tuple[TopicRow, ...]] = {
    ROLE_API: (
        (constants.TOPIC_REQUESTS_PREFIX, True, (WRITE,)),
        # a batch job's create and cancel (llmq_jobs.joblog): its record and lines, never a claim or a settled result
        (constants.job_topic("specs"), False, (WRITE,)),
        (constants.job_topic("lines"), False, (WRITE,)),
    ),
    ROLE_BATCHER: (
        (constants.TOPIC_REQUESTS_PREFIX, True, (READ,)),
        (constants.TOPIC_INGRESS_PREFIX, True, (READ,)),
        (constants.TOPIC_BATCHES, False, (WRITE,)),
        (constants.TOPIC_RESULTS, False, (READ, WRITE)),
        (constants.TOPIC_DEAD_LETTERS, False, (WRITE,)),
    ),
    ROLE_WORKER: (
        (constants.TOPIC_BATCHES, False, (READ,)),
        (constants.TOPIC_RESULTS, False, (WRITE,)),
        (constants.TOPIC_DEAD_LETTERS, False, (WRITE,)),
    ),
    ROLE_ROUTER: (
        (constants.TOPIC_RESULTS, False, (READ,)),
        (constants.requests_topic(constants.DEFERRED), False, (WRITE,)),
        (constants.TOPIC_DEAD_LETTERS, False, (WRITE,)),
        (constants.TOPIC_JOBS_PREFIX, True, (READ, WRITE)),  # drives jobs: the only role that settles and claims
    ),
}
# role -> (consumer group, prefixed)
KAFKA_GROUPS: dict[str, tuple[tuple[str, bool], ...]] = {
    ROLE_BATCHER: ((constants.GROUP_BATCHER, False),),
    ROLE_WORKER: ((constants.GROUP_WORKER_PREFIX, True),),
    ROLE_ROUTER: ((constants.GROUP_RESULT_ROUTER, False), (constants.GROUP_PEER_RESULTS, False)),
}


def kafka_acls(
    reply_topic_prefixes: Iterable[str] = (),
    ingress_principals: Iterable[str] = (),
    peer_regions: Iterable[str] = (),
    ingress_reply_prefixes: Mapping[str, Iterable[str]] | None = None,
) -> list[KafkaAcl]:
    """Every ACL of a secure cluster (the admin is a super user and needs none). ``reply_topic_prefixes``: where the
    router may write replies (``Settings.kafka.reply_topic_prefixes``; none: no reply topics). ``ingress_principals``:
    Kafka-direct producers, each writing its own ingress topic only and reading its reply topics, in its own group:
    those under its ``ingress_reply_prefixes`` entry, else under ``reply_topic_prefixes`` (the router writes every
    one). ``peer_regions``: the regions MirrorMaker 2 mirrors from and to (docs/operations/multi-region.md; none: no
    mm2 rules)."""
    peers, principals = tuple(peer_regions), tuple(ingress_principals)
    shared = tuple(reply_topic_prefixes)
    own_prefixes = {p: tuple((ingress_reply_prefixes or {}).get(p, shared)) for p in principals}
    topics = {role: list(rows) for role, rows in KAFKA_TOPICS.items()}
    groups = {role: list(rows) for role, rows in KAFKA_GROUPS.items()}
    every_reply_prefix = dict.fromkeys((*shared, *(x for p in principals for x in own_prefixes[p])))
    # writes replies; reads them only to settle a reply claimed but never marked delivered (llmq_result_router.once)
    topics[ROLE_ROUTER] += [(prefix, True, (READ, WRITE)) for prefix in every_reply_prefix]
    topics[ROLE_ROUTER] += [(constants.remote_topic(peer, constants.TOPIC_RESULTS), False, (READ,)) for peer in peers]
    # fencing: the claims on jobs of each peer (llmq_result_router.owners); the view of the jobs moved to a peer: its
    # records and ledger (llmq_result_router.moved)
    followed = [constants.job_topic(kind) for kind in ("owners", "specs", "ledger")]
    topics[ROLE_ROUTER] += [(constants.remote_topic(peer, t), False, (READ,)) for peer in peers for t in followed]
    for principal in principals:
        topics[principal] = [(constants.ingress_topic(principal), False, (WRITE,))]
        topics[principal] += [(prefix, True, (READ,)) for prefix in own_prefixes[principal]]
        groups[principal] = [(constants.ingress_group(principal), False)]
    if peers:
        topics[ROLE_MM2] = _mirror_topics(peers)
    acls = [
        KafkaAcl(role, TOPIC, name, operation, prefixed)
        for role, rows in topics.items()
        for name, prefixed, operations in rows
        for operation in (*operations, DESCRIBE_CONFIGS)
    ]
    acls += [KafkaAcl(role, GROUP, name, READ, prefixed) for role, rows in groups.items() for name, prefixed in rows]
    if peers:  # checkpoints describe llmq's groups (source); Connect's worker group of each inbound flow (target)
        acls.append(KafkaAcl(ROLE_MM2, GROUP, _LLMQ_GROUP_PREFIX, DESCRIBE, prefixed=True))
        acls += [KafkaAcl(ROLE_MM2, GROUP, f"{peer}-mm2", READ) for peer in peers]
    return acls


def ingress_reply_prefixes(grants: Mapping[str, IngressGrant]) -> dict[str, tuple[str, ...]]:
    """Principal -> the reply-topic prefixes its ``LLMQ_KAFKA_INGRESS`` grant binds it to (settings fill in
    ``<principal>.`` for a grant naming none; a grant built without any is left out)."""
    return {p: g.reply_topic_prefixes for p, g in grants.items() if g.reply_topic_prefixes}


def settings_acls(settings: Settings) -> list[KafkaAcl]:
    """The ACLs a cluster needs for ``settings``: its reply prefixes, ingress grants and peer regions (what ``llmq
    topics --acls``, the Helm chart's hook, applies)."""
    return kafka_acls(
        reply_topic_prefixes(settings),
        settings.kafka.ingress,
        settings.region.peer_regions,
        ingress_reply_prefixes(settings.kafka.ingress),
    )


_LLMQ_GROUP_PREFIX = "llmq-"


def _mirror_topics(peers: tuple[str, ...]) -> list[tuple[str, bool, tuple[int, ...]]]:
    """MirrorMaker 2's topic rules on one region's cluster, for flows to and from ``peers``."""
    own = (READ, WRITE, CREATE)
    return [
        (constants.TOPIC_JOBS_PREFIX, True, (READ,)),  # source of the outbound flows
        (constants.TOPIC_RESULTS, False, (READ,)),
        (MM2_TOPIC_PREFIX, True, own),
        (MM2_HEARTBEATS_TOPIC, False, own),
        # target of the inbound flows: remote topics and checkpoints, created, written, their configs kept in sync
        *((f"{peer}.", True, (*own, ALTER, ALTER_CONFIGS)) for peer in peers),
    ]


async def apply_kafka_acls(admin_settings: Settings, acls: Iterable[KafkaAcl]) -> None:
    """Create ``acls`` on the cluster as the admin principal (creating one that exists changes nothing).
    aiokafka has no ACL call: its CreateAcls request (one ACL each) goes to a broker directly."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import CreateAclsRequest

    admin = make_admin(admin_settings)
    await admin.start()
    try:
        for acl in acls:
            pattern = PREFIXED if acl.prefixed else LITERAL
            request = CreateAclsRequest(
                acl.resource, acl.name, pattern, f"User:{acl.principal}", "*", acl.operation, ALLOW
            )
            response = await admin._send_request(request)
            for code, message in response.creation_responses:
                if code:
                    raise for_code(code)(f"creating ACL {acl.describe()}: {message}")
    finally:
        await admin.close()


# --- Redis ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedisRole:
    """What one role may do on Redis: channels it SUBSCRIBEs to and channels it PUBLISHes on (kept apart with a
    Redis 7 selector: channel patterns of one rule allow both), and the keys it reads and writes."""

    subscribe: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    keys: tuple[str, ...] = ("llmq:*",)


_REPLIES = constants.REDIS_REPLIES_PREFIX + "*"
REDIS_ROLES: dict[str, RedisRole] = {
    ROLE_API: RedisRole(
        subscribe=(_REPLIES, constants.REDIS_HEARTBEATS_CHANNEL), publish=(constants.REDIS_CANCELS_CHANNEL,)
    ),
    ROLE_BATCHER: RedisRole(
        subscribe=(constants.REDIS_HEARTBEATS_CHANNEL, constants.REDIS_CANCELS_CHANNEL),
        publish=(constants.REDIS_CANCELS_CHANNEL, _REPLIES),
    ),
    ROLE_WORKER: RedisRole(
        subscribe=(constants.REDIS_CANCELS_CHANNEL,), publish=(constants.REDIS_HEARTBEATS_CHANNEL, _REPLIES)
    ),
    ROLE_ROUTER: RedisRole(publish=(_REPLIES,)),
}
# Data commands only: no administration (CONFIG, FLUSHALL, KEYS, DEBUG...), no pub/sub beyond each role's rows.
_REDIS_COMMANDS = (
    "-@all +@read +@write +@transaction +@connection +evalsha +eval +script|load +script|exists -@dangerous"
)


def redis_acl_file(passwords: dict[str, str]) -> str:
    """A Redis ACL file (``aclfile``): the default user off, one user per role in :data:`REDIS_ROLES` and the admin
    (everything; ``llmq dev`` and operators), each with its password from ``passwords`` (role -> password)."""
    lines = ["user default off"]
    for role, rules in REDIS_ROLES.items():
        line = [f"user {role} on >{passwords[role]} resetkeys resetchannels", _REDIS_COMMANDS]
        line += [f"~{pattern}" for pattern in rules.keys]
        if rules.subscribe:
            line += ["+subscribe +unsubscribe", *(f"&{channel}" for channel in rules.subscribe)]
        if rules.publish:
            line.append("(+publish " + " ".join(f"&{channel}" for channel in rules.publish) + ")")
        lines.append(" ".join(line))
    lines.append(f"user {ROLE_ADMIN} on >{passwords[ROLE_ADMIN]} ~* &* +@all")
    return "\n".join(lines) + "\n"

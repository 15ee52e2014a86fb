"""Settings of the llmq services, grouped by owner: ``settings.api.max_body_bytes`` is read from ``LLMQ_API_MAX_BODY_BYTES``.

Each group is a ``pydantic_settings.BaseSettings`` with its own environment prefix (:func:`env_name` gives a field's
variable). A :class:`Settings` reads a group from the environment the first time it is used, so a service validates
only the groups it reads; its main names them to :func:`load_settings`, which validates them at start and refuses a bad
value naming its variable (:class:`SettingsError`). Renamed variables are still read under their old name (the new one
wins), with one warning per process and old name. docs/configuration.md is generated from the fields' descriptions
(``python -m llmq_core.settings_doc``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, ClassVar, Generic, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from llmq_core import ids
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, PRIORITY_CLASSES, RECORD_HEADROOM_BYTES, TRAFFIC_CLASSES

log = logging.getLogger(__name__)

# A Kafka principal's name becomes a topic name (constants.ingress_topic): only what a topic name may hold
_PRINCIPAL_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_ONE_RECORD_MOST = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES
# The environment a group is read from: os.environ unless Settings.from_environ gives one
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("llmq_settings_environ", default=None)
_WARNED: set[str] = set()  # old variable names already warned about in this process


class SettingsError(ValueError):
    """A settings group could not be read from the environment; the message names each bad variable."""


def was(*old_names: str) -> dict[str, Any]:
    """A field's ``json_schema_extra``: the environment variables it was read from before it moved (still read)."""
    return {"old_env": old_names}


def old_names(field: FieldInfo) -> tuple[str, ...]:
    extra = field.json_schema_extra
    return tuple(extra.get("old_env", ())) if isinstance(extra, dict) else ()  # type: ignore[arg-type]


class _Environ(EnvSettingsSource):
    """The environment source, reading Settings.from_environ's mapping where one is given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        if environ is None:
            return super()._load_env_vars()
        return {k.lower(): v for k, v in environ.items()}


class _OldNames(_Environ):
    """A field's old variable names (``was``), below its own: each one used is warned about once per process."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for old in old_names(field):
            value = self.env_vars.get(old.lower())
            if value is not None:
                if old not in _WARNED:
                    _WARNED.add(old)
                    log.warning("%s is deprecated: set %s instead", old, env_name(self.settings_cls, field_name))
                return value, field_name, False
        return None, field_name, False


class Group(BaseSettings):
    """One owner's settings, from ``<env_prefix><FIELD>`` (or the field's ``validation_alias``)."""

    model_config = SettingsConfigDict(extra="ignore", validate_by_name=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environ(settings_cls), _OldNames(settings_cls)

    @classmethod
    def from_env(cls) -> Group:
        """The group from the environment; SettingsError naming each variable whose value is refused."""
        try:
            return cls()
        except ValidationError as exc:
            problems = "; ".join(_problem(cls, error) for error in exc.errors())
            raise SettingsError(f"invalid settings: {problems}") from None


def env_name(group: type[BaseSettings], field_name: str) -> str:
    """The environment variable of ``group``'s field ``field_name``, e.g. ``LLMQ_API_MAX_BODY_BYTES``."""
    alias = group.model_fields[field_name].validation_alias
    if isinstance(alias, str):
        return alias
    return f"{group.model_config.get('env_prefix', '')}{field_name}".upper()


def _problem(group: type[BaseSettings], error: Any) -> str:
    field = str(error["loc"][0]) if error["loc"] else ""
    where = env_name(group, field) if field in group.model_fields else group.__name__
    return f"{where}: {error['msg']}"


class IngressGrant(BaseModel):
    """What the records of one Kafka-direct producer's ingress topic speak for: one tenant, the classes it may use and
    the reply topics it may name (``reply_topic_prefixes``; none given: ``<principal>.`` under each shared prefix,
    filled in by :class:`KafkaSettings`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tenant_id: str = Field(min_length=1)
    classes: tuple[Literal["interactive", "near_interactive", "deferred"], ...] = TRAFFIC_CLASSES
    reply_topic_prefixes: tuple[str, ...] = ()

    @field_validator("tenant_id")
    @classmethod
    def _scopes_ids(cls, value: str) -> str:
        """The tenant scopes its producer's request ids (ids.tenant_scoped_id): refuse one that cannot."""
        ids.tenant_scoped_id(value, "")
        return value

    @field_validator("reply_topic_prefixes")
    @classmethod
    def _prefixes_name_topics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """An empty prefix would allow every topic: refuse it."""
        if any(not prefix for prefix in value):
            raise ValueError("reply_topic_prefixes must not hold an empty prefix")
        return value


def _fits_one_record(value: int, info: ValidationInfo, what: str) -> int:
    """Refuse to start with a limit no Kafka record could carry."""
    if value > _ONE_RECORD_MOST:
        raise ValueError(
            f"{info.field_name} {value} exceeds {_ONE_RECORD_MOST} bytes (KAFKA_MAX_MESSAGE_BYTES minus"
            f" RECORD_HEADROOM_BYTES): {what}"
        )
    return value


class RegionSettings(Group):
    """This deployment's region (docs "Multi-region"): in every instance, request, batch and batch-job id, metric and
    log line."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_REGION_")
    name: str = Field(
        ids.DEFAULT_REGION,
        validation_alias="LLMQ_REGION",
        description="This stack's region (1-32 of `a-z 0-9 -`, lower case, not starting or ending in `-`; a service "
        "refuses any other at start): in every instance, request, batch and batch-job id, metric (`region` "
        "label) and log line; MirrorMaker 2's alias of its cluster ([multi-region](operations/multi-region.md)).",
    )
    limit_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share (0-1] of each tenant's global rate limits (keys file) this region enforces, with no "
        "cross-region call ([multi-region](operations/multi-region.md)).",
    )
    peers: str = Field(
        "",
        description="Comma-separated regions mirrored to and from this one: the only regions whose claims on batch "
        "jobs (their mirrored `<peer>.llmq.jobs.owners`) count here and that `llmq region failover` takes jobs from; "
        "a claim of any other region is ignored ([multi-region](operations/multi-region.md)).",
    )
    failover_heartbeat_max_age_s: float = Field(
        15.0,
        gt=0,
        description="`llmq region failover --from <peer>` refuses (unless `--force`) when the newest heartbeat of "
        "the peer's inbound MirrorMaker 2 (this region -> peer, emitted every second and mirrored back here as "
        "`<peer>.heartbeats`) is older than this, or missing: the peer would not learn of the takeover and would "
        "keep running its jobs. Covers the heartbeat interval, the replication lag both ways and the clock skew "
        "between the regions ([multi-region](operations/multi-region.md)).",
    )

    @field_validator("name")
    @classmethod
    def _region_name(cls, value: str) -> str:
        return ids.check_region(value)

    @field_validator("peers")
    @classmethod
    def _peer_names(cls, value: str) -> str:
        for peer in filter(None, value.split(",")):
            ids.check_region(peer.strip())
        return value

    @property
    def peer_regions(self) -> tuple[str, ...]:
        """:attr:`peers` as region names."""
        return tuple(p.strip() for p in self.peers.split(",") if p.strip())


class KafkaSettings(Group):
    """Kafka: connection, transport security (docs/security.md), topics, Kafka-direct producers, client tuning."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_KAFKA_")
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", min_length=1, description="Kafka bootstrap servers, comma-separated."
    )
    security_protocol: Literal["PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT",
        description="`PLAINTEXT`, `SASL_SSL` (SCRAM over TLS) or `SSL` (TLS; mTLS with a client certificate); see "
        "docs/security.md.",
    )
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism under `SASL_SSL` (`SCRAM-SHA-512`, `SCRAM-SHA-256`, `PLAIN`)."
    )
    sasl_username: str = Field(
        "",
        description="This service's Kafka principal (one per role: `api`, `batcher`, `worker`, `router`; `admin` for "
        "`llmq topics`).",
    )
    sasl_password: str = Field("", description="Its password (prefer the file below).")
    sasl_password_file: str = Field(
        "", description="File holding the password (a mounted secret); wins over `LLMQ_KAFKA_SASL_PASSWORD`."
    )
    ssl_cafile: str = Field("", description="PEM CA that signed the brokers' certificates (empty: the system's CAs).")
    ssl_certfile: str = Field("", description="PEM client certificate for mTLS (`SSL`): its CN is the principal.")
    ssl_keyfile: str = Field("", description="Its private key.")
    request_topic_partitions: int = Field(
        4,
        ge=1,
        description="Partitions of each `llmq.requests.<class>` topic (batcher parallelism).",
        json_schema_extra=was("LLMQ_REQUEST_TOPIC_PARTITIONS"),
    )
    batch_topic_partitions: int = Field(
        16,
        ge=1,
        description="Partitions of `llmq.batches`: the most workers one stack can have.",
        json_schema_extra=was("LLMQ_BATCH_TOPIC_PARTITIONS"),
    )
    results_topic_partitions: int = Field(
        4,
        ge=1,
        description="Partitions of `llmq.results` (result-router parallelism).",
        json_schema_extra=was("LLMQ_RESULTS_TOPIC_PARTITIONS"),
    )
    topic_replication_factor: int = Field(
        1,
        ge=1,
        description="Replicas of each llmq topic that `llmq topics` (and a PLAINTEXT stack's batcher and result-router) "
        "create: 1 for local and test stacks, 3 on a production cluster (the Helm chart's "
        "`kafka.topicReplicationFactor`).",
        json_schema_extra=was("LLMQ_TOPIC_REPLICATION_FACTOR"),
    )
    reply_topic_prefixes: str = Field(
        "",
        description="Comma-separated prefixes a Kafka reply topic must start with (empty: any legal name but `llmq.*` and"
        " `__*`); other requests are answered `errored` (`invalid_reply_topic`) and dead-lettered.",
    )
    request_id_ttl_s: int = Field(
        86400,
        gt=0,
        description="How long a Kafka-direct `request_id` stays known: a record re-produced with it gets the stored "
        "result again (`request_copy` set), or, once that is gone, `errored` `request_id_reused` (see "
        "docs/kafka-producers.md).",
    )
    ingress: dict[str, IngressGrant] = Field(
        {},
        description='Kafka-direct producers, JSON: principal -> `{"tenant_id": ..., "classes": [...],'
        ' "reply_topic_prefixes": [...]}`; the batcher reads each one\'s topic `llmq.ingress.<principal>` (created by'
        " `llmq topics`) and answers a record claiming another tenant or class `errored` `tenant_not_allowed` /"
        " `class_not_allowed`, one naming a reply topic outside its prefixes (default: `<principal>.` under each of"
        " `LLMQ_KAFKA_REPLY_TOPIC_PREFIXES`) `errored`"
        " `invalid_reply_topic` (see docs/security.md).",
    )
    producer_linger_ms: int = Field(
        0,
        ge=0,
        description="How long a producer waits to group records (0: sent at once, so no hop waits out a linger at"
        " light load; under load records still group behind the one request in flight per broker).",
    )
    producer_max_batch_bytes: int = Field(
        1 << 20,
        gt=0,
        description="Bytes of records one produce request may carry per partition, for the producers that write only"
        " llmq's own topics (API pods, `llmq region`): larger batches move batch-job input faster.",
    )
    results_fetch_max_wait_ms: int = Field(
        100,
        ge=0,
        description="The result-router and the batcher's results tail (off the answer's path): the broker holds"
        " their fetches up to this long, or until `LLMQ_KAFKA_RESULTS_FETCH_MIN_BYTES`; reply topics and stored results lag by"
        " up to this.",
    )
    results_fetch_min_bytes: int = Field(64 * 1024, ge=1, description="See `LLMQ_KAFKA_RESULTS_FETCH_MAX_WAIT_MS`.")
    topics_ready_timeout_s: float = Field(
        60,
        gt=0,
        description="Topic creation and consumer services wait at most this long for their topics to show a leader"
        " for every partition (a consumer subscribing before leaves the topic out for minutes).",
    )

    def reply_prefixes(self) -> tuple[str, ...]:
        """``reply_topic_prefixes`` as a tuple; empty: any topic ``kafka.reply_topic_error`` does not refuse."""
        return tuple(p for p in (x.strip() for x in self.reply_topic_prefixes.split(",")) if p)

    @model_validator(mode="after")
    def _bind_reply_prefixes(self) -> KafkaSettings:
        """A grant naming no reply topics gets its principal's own: ``<principal>.`` under each shared prefix (none
        set: at the top), so its replies stay where the result-router may write."""
        shared = self.reply_prefixes() or ("",)
        self.ingress = {
            principal: grant
            if grant.reply_topic_prefixes
            else grant.model_copy(update={"reply_topic_prefixes": tuple(f"{p}{principal}." for p in shared)})
            for principal, grant in self.ingress.items()
        }
        return self

    @field_validator("ingress")
    @classmethod
    def _principals_name_topics(cls, value: dict[str, IngressGrant]) -> dict[str, IngressGrant]:
        """Each principal names its ingress topic: refuse to start with one no topic could be named after."""
        bad = [p for p in value if not _PRINCIPAL_RE.fullmatch(p)]
        if bad:
            raise ValueError(f"kafka ingress principals {bad} must be 1-200 characters of A-Z a-z 0-9 . _ -")
        return value


class RedisSettings(Group):
    """Redis: connection and transport security (docs/security.md)."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_REDIS_")
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        min_length=1,
        description="Redis URL (replies pub/sub, heartbeats, cancels, stored results, ledgers).",
    )
    username: str = Field("", description="This service's Redis ACL user (one per role, like Kafka's principals).")
    password: str = Field("", description="Its password (prefer the file below).")
    password_file: str = Field("", description="File holding the Redis password; wins over `LLMQ_REDIS_PASSWORD`.")
    ssl_cafile: str = Field("", description="PEM CA of the Redis server's certificate (with a `rediss://` URL).")
    ssl_certfile: str = Field("", description="Client certificate, where Redis requires one (`tls-auth-clients yes`).")
    ssl_keyfile: str = Field("", description="Its private key.")


_MS = {"ge": 1}


class ApiSettings(Group):
    """The API pods: the HTTP edge, admission, deadlines per class, API keys, pod heartbeats."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_API_")
    instance_id: str = Field(
        "",
        description="API pod instance id; `--instance-id` wins; empty: generated at start (hostname + random suffix).",
        json_schema_extra=was("LLMQ_INSTANCE_ID"),
    )
    interactive_default_timeout_ms: int = Field(
        30_000,
        **_MS,
        description="Interactive: deadline of a request without `x-llmq-timeout-ms`.",
        json_schema_extra=was("LLMQ_DEFAULT_TIMEOUT_MS"),
    )
    interactive_max_timeout_ms: int = Field(
        600_000,
        **_MS,
        description="Interactive: the most `x-llmq-timeout-ms` may ask (larger values are clamped).",
        json_schema_extra=was("LLMQ_MAX_TIMEOUT_MS"),
    )
    near_interactive_default_timeout_ms: int = Field(
        60_000,
        **_MS,
        description="Near_interactive: default deadline.",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_DEFAULT_TIMEOUT_MS"),
    )
    near_interactive_max_timeout_ms: int = Field(
        600_000,
        **_MS,
        description="Near_interactive: largest deadline.",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_MAX_TIMEOUT_MS"),
    )
    deferred_default_timeout_ms: int = Field(
        3_600_000,
        **_MS,
        description="Deferred: default deadline.",
        json_schema_extra=was("LLMQ_DEFERRED_DEFAULT_TIMEOUT_MS"),
    )
    deferred_max_timeout_ms: int = Field(
        86_400_000,
        **_MS,
        description="Deferred: largest deadline.",
        json_schema_extra=was("LLMQ_DEFERRED_MAX_TIMEOUT_MS"),
    )
    pod_heartbeat_interval_ms: int = Field(
        1000,
        **_MS,
        description="How often an API pod refreshes its liveness key.",
        json_schema_extra=was("LLMQ_POD_HEARTBEAT_INTERVAL_MS"),
    )
    pod_heartbeat_ttl_ms: int = Field(
        5000,
        **_MS,
        description="An API pod whose key is this old is dead: its work is cancelled.",
        json_schema_extra=was("LLMQ_POD_HEARTBEAT_TTL_MS"),
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1, description="Larger request bodies get 413.")
    public_base_url: str = Field(
        "",
        description="The URL clients reach the API at (`https://llm.example.com`), for absolute URLs the API hands out "
        "(a Message Batch's `results_url`); empty: the request's own scheme and `Host`.",
    )
    produce_timeout_ms: int = Field(
        2000, **_MS, description="Bound on producing one request to Kafka; past it the client gets 503."
    )
    max_in_flight: int = Field(10_000, ge=0, description="Waiters per pod; past it new requests get 429.")
    max_stop_bytes: int = Field(
        256, ge=1, description="UTF-8 bytes of one stop sequence; longer ones get 400 (param `stop`)."
    )
    max_json_schema_bytes: int = Field(
        32 * 1024,
        ge=1,
        description="UTF-8 bytes of the JSON Schema a request constrains its answer to (`response_format`'s "
        "`json_schema.schema`, or all of its `tools`' parameters), as compact JSON; larger ones get 400 "
        "(param `response_format` or `tools`). Kafka-direct requests are held to it by the batcher.",
    )
    kafka_breaker_backoff_ms: int = Field(
        1000,
        **_MS,
        description="After a failed or timed-out produce, new requests get 503 + `Retry-After` at once for this long; "
        "then one request probes Kafka.",
    )
    kafka_breaker_max_backoff_ms: int = Field(
        5000, **_MS, description="Each failed probe doubles the backoff, up to this."
    )
    kafka_check_interval_ms: int = Field(
        1000,
        **_MS,
        description="How often a pod checks that its Kafka client reaches a broker (a metadata request): opens the "
        "breaker without a failed request, and closes it within one interval of the broker's return, also on "
        "an idle pod.",
    )
    keys_file: str = Field(
        "", description="YAML/JSON: API key -> tenant, tier, classes, limits (see deploy/keys.example.yaml)."
    )
    dev_keys: bool = Field(
        True, description="Also accept llmq-dev-key (tenant dev, paid) and llmq-dev-free-key (tenant dev-free, free)."
    )
    shed_wait_ms: dict[str, int] = Field(
        dict(zip(PRIORITY_CLASSES, (15_000, 5_000, 2_000, 1_000), strict=True)),
        description="Admission: predicted queue wait (ms) per priority class past which new requests get 429.",
    )
    shed_share: dict[str, float] = Field(
        dict(zip(PRIORITY_CLASSES, (0.95, 0.85, 0.7, 0.5), strict=True)),
        description="Admission: share of the pod's in-flight cap and the batcher's queue a priority class may fill.",
    )
    saturation_stale_ms: int = Field(5000, **_MS, description="Batcher saturation reports older than this are ignored.")
    rate_limit_timeout_ms: int = Field(
        250,
        gt=0,
        description="A tenant's rate-limit check waits this long on Redis; past it the request goes through unlimited "
        "(fail open); must be > 0.",
    )
    header_timeout_ms: int = Field(
        10_000,
        **_MS,
        description="A request's headers must arrive within this, counted from the connection's start (or the next "
        "request's first byte on a kept-alive one); past it 408 and the connection closes.",
    )
    body_timeout_ms: int = Field(
        300_000,
        **_MS,
        description="A request's whole body must arrive within this after its headers; past it 408 and the connection "
        "closes (responses, streams included, are never timed).",
    )
    keep_alive_timeout_ms: int = Field(5_000, **_MS, description="An idle kept-alive connection is closed after this.")
    stream_resume_window_ms: int = Field(
        10_000,
        ge=0,
        description="A stream sent with an `Idempotency-Key` keeps running this long after its client left or its"
        " pod died; a request with that key (and `Last-Event-ID`) to any pod resumes it within it, else it is"
        " cancelled (0: cancelled at once, as any other stream).",
    )
    sse_keep_alive_ms: int = Field(
        15_000,
        **_MS,
        description="A stream that has written nothing for this long (its prompt's prefill, a queue) gets an SSE "
        "comment (`: keep-alive`), so a proxy's or load balancer's idle timeout does not cut it.",
    )
    max_connections_per_client: int = Field(
        1024,
        ge=0,
        description="Open connections per client address (the socket peer); past it a new connection gets 429 "
        "`too_many_connections` once its request head is read, and is closed without a reset (0: no cap).",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1,
        description="Bytes of a request's line and headers, counted as they arrive; past it 431 `headers_too_large` and "
        "the connection closes.",
    )
    shutdown_delay_ms: int = Field(
        0,
        ge=0,
        description="After SIGTERM the pod keeps its listener open this long, answering readiness and new generation "
        "requests with 503 + `Retry-After`, so that a load balancer probing readiness stops sending it connections "
        "before it closes (a connection still arriving at the close would be reset). Counted inside "
        "`LLMQ_SHUTDOWN_GRACE_S`; on Kubernetes the chart's preStop sleep does this (0).",
    )
    access_log: bool = Field(
        True,
        description="One log line per request (logger `llmq_api.access`): method, route template, status, tenant, "
        "request id, latency as JSON fields; never a path, a prompt or an answer.",
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses or CIDR networks of proxies in front of the pods: their connections are "
        "not capped, and only their `X-Forwarded-For` names the client (empty: no header is trusted).",
    )

    @field_validator("max_body_bytes")
    @classmethod
    def _body_fits_one_record(cls, value: int, info: ValidationInfo) -> int:
        return _fits_one_record(value, info, "such a request could not be produced to Kafka")


class ResultStoreSettings(Group):
    """Stored results (retrieval copies), written by the result-router and read by the API pods."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_RESULT_STORE_")
    ttl_s: int = Field(
        3600,
        ge=1,
        description="How long final results stay retrievable (`GET /v1/requests/{id}`, idempotent replays).",
        json_schema_extra=was("LLMQ_RESULT_TTL_S"),
    )
    tenant_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Stored results one tenant keeps at most (bytes); past it its oldest are dropped (see Redis memory).",
    )
    tenant_max_results: int = Field(
        100_000, ge=1, description="Stored results one tenant keeps at most (count); past it its oldest are dropped."
    )


class ModelsSettings(Group):
    """Models beyond the built-in catalogue, and where catalogue checkpoints live."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_MODELS_")
    extra: list[str] = Field(
        [],
        description="JSON list of model names served besides the built-in catalogue (`--model-path` workers): every other"
        " model name a request carries is labelled `other` in metrics.",
        json_schema_extra=was("LLMQ_EXTRA_MODELS"),
    )
    tokenizers: dict[str, str] = Field(
        {},
        description="JSON: model -> its `tokenizer.json` (or a checkpoint directory holding it and its chat template), "
        "for models outside the catalogue (`--model-path` workers): API pods and batchers count their prompt "
        "tokens with it; any other model counts UTF-8 bytes, an upper bound.",
        json_schema_extra=was("LLMQ_MODEL_TOKENIZERS"),
    )
    dir: str = Field(
        "~/.cache/llmq/models",
        description="Converted catalogue checkpoints, `<dir>/<model>/` with `llmq-manifest.json` (`make setup` installs "
        "them); workers load them, API pods and batchers read their tokenizers.",
    )


class BatcherSettings(Group):
    """The batcher: how long batches wait per class, queue bounds, fair share, worker liveness."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_BATCHER_")
    interactive_max_wait_ms: int = Field(
        0,
        ge=0,
        description="Batch window of interactive work (0: dispatch at once to continuous-batching workers).",
        json_schema_extra=was("LLMQ_INTERACTIVE_MAX_WAIT_MS"),
    )
    near_interactive_max_wait_ms: int = Field(
        50,
        ge=0,
        description="Batch window bound of near_interactive work (adaptive below it).",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_MAX_WAIT_MS"),
    )
    deferred_max_wait_ms: int = Field(
        500,
        ge=0,
        description="Batch window bound of deferred work (adaptive below it).",
        json_schema_extra=was("LLMQ_DEFERRED_MAX_WAIT_MS"),
    )
    fixed_engine_max_wait_ms: int = Field(
        20,
        ge=0,
        description="Wait window for fixed-time batch engines (part of the latency budget).",
        json_schema_extra=was("LLMQ_FIXED_ENGINE_MAX_WAIT_MS"),
    )
    fixed_engine_busy_wait_ms: int = Field(
        10,
        ge=0,
        description="While a batch of a fixed-time model runs, the next one fills until it ends, at most this long (0: "
        "off; with no batch running nothing waits).",
        json_schema_extra=was("LLMQ_FIXED_ENGINE_BUSY_WAIT_MS"),
    )
    worker_heartbeat_timeout_ms: int = Field(
        2000,
        **_MS,
        description="A worker silent this long is removed and its in-flight work dispatched again.",
        json_schema_extra=was("LLMQ_WORKER_HEARTBEAT_TIMEOUT_MS"),
    )
    max_queued: int = Field(
        100_000, ge=0, description="Requests one batcher holds at most; beyond, new ones are answered overloaded."
    )
    deferred_reserved_share: float = Field(
        0.25, ge=0, lt=1, description="Share of each worker's slots deferred work never fills."
    )
    deferred_buffer_rounds: int = Field(
        2,
        ge=1,
        description="Deferred work a batcher reads ahead of the slots: this many times every live worker's unreserved "
        "slots.",
    )
    tenant_max_inflight: int = Field(4096, ge=1, description="Dispatched, not yet finished requests per tenant.")
    tenant_weights: dict[str, float] = Field(
        {}, description="Fair-share weight per tenant_id (JSON in env); others weigh 1."
    )
    shared_capacity: bool = Field(
        True,
        description="Each batch claims its requests from its worker's capacity ledger in Redis before it is produced,"
        " so that the batchers of a group hand a worker's room out once (docs/architecture.md#several-batchers).",
    )
    fixed_engine_leads_ms: list[int] = Field(
        [120, 90, 60, 40],
        description="Per priority class (interactive paid, interactive free, near_interactive, deferred; JSON in env):"
        " how long before a fixed-time worker's next window that class's batches may be sent ahead to wait for it in"
        " the worker's queue, so that the window fills in class precedence from every batcher ([]: none, a batch goes"
        " when the worker's work drains). Each must exceed `LLMQ_BATCHER_DISPATCH_MARGIN_MS`.",
    )
    dispatch_margin_ms: int = Field(
        30,
        ge=0,
        description="A batch's way from its batcher to its worker's queue: a fixed-time worker's next window takes no"
        " claim later than this before it starts.",
    )
    capacity_grant_ttl_ms: int = Field(
        2000,
        **_MS,
        description="A ledger grant counts against its worker for at most this long until the worker takes its batch"
        " (a batch never produced, or a killed batcher's, stops holding room then).",
    )
    worker_queue_bound: int = Field(
        0,
        ge=0,
        description="Requests a continuous-batching worker may be handed beyond its slots (its queue), fleet-wide.",
    )
    prefix_routing: bool = Field(
        True,
        description="A continuous-batching worker is chosen for the longest prefix of a batch's first request its"
        " prompt cache holds (the workers' summaries and this batcher's own dispatches), unless it is loaded past"
        " `LLMQ_BATCHER_PREFIX_AFFINITY_MAX_LOAD`; off: the least-loaded worker (docs/architecture.md#prefix-aware-"
        "dispatch). Fixed-time workers are always chosen least-loaded.",
    )
    prefix_affinity_max_load: float = Field(
        0.75,
        gt=0,
        le=1,
        description="The worker holding a batch's prefix keeps it while its load (1 - free/max slots, free slots as"
        " its heartbeat said less what this batcher sent it since) is below this; from it on the batch goes to the"
        " least-loaded worker instead (a `load_override`).",
    )
    prefix_index_ttl_ms: int = Field(
        5000,
        **_MS,
        description="A worker's prefix summary not renewed within this is dropped, and so is a prefix this batcher"
        " sent a worker this long ago: the worker then draws no affinity for it.",
    )
    max_continuations: int = Field(
        3,
        ge=0,
        description="Times a request whose worker was lost continues on another from the tokens it had generated"
        " (docs/workers.md#continuation); past it (0: never) it runs again from its start, and a stream whose text"
        " reached its caller ends `stream_interrupted`. Like Dynamo's `--migration-limit`.",
    )

    @model_validator(mode="after")
    def _leads(self) -> BatcherSettings:
        leads = self.fixed_engine_leads_ms
        if leads and (
            len(leads) != len(PRIORITY_CLASSES)
            or leads != sorted(leads, reverse=True)
            or min(leads) <= self.dispatch_margin_ms
        ):
            raise ValueError(
                "LLMQ_BATCHER_FIXED_ENGINE_LEADS_MS: four leads, one per priority class, highest class first and not"
                f" increasing, each above LLMQ_BATCHER_DISPATCH_MARGIN_MS ({self.dispatch_margin_ms}); got {leads}"
            )
        return self

    def max_wait_ms(self) -> dict[str, int]:
        """Traffic class -> its max wait (ms)."""
        return {
            "interactive": self.interactive_max_wait_ms,
            "near_interactive": self.near_interactive_max_wait_ms,
            "deferred": self.deferred_max_wait_ms,
        }


class WorkerSettings(Group):
    """A worker process. Each of its flags (`python -m llmq_worker.main --help`) wins over its setting."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_WORKER_")
    heartbeat_interval_ms: int = Field(
        250,
        **_MS,
        description="Worker heartbeat interval (capacity for routing).",
        json_schema_extra=was("LLMQ_HEARTBEAT_INTERVAL_MS"),
    )
    lease_ttl_ms: int = Field(
        10_000,
        **_MS,
        description="A worker holds its partition of llmq.batches by a Redis lease renewed every third of this; a second "
        "worker given that partition waits as a standby, and takes over within this long plus one renewal "
        "interval (a third of it) after the holder died (SIGKILL; at once when the holder was a process of "
        "its own host that is gone).",
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description="Transformers engine on CPU: torch's intra-op threads (0: 1, measured on a shared 2-core machine, see"
        " docs/performance.md).",
        json_schema_extra=was("LLMQ_TORCH_THREADS"),
    )
    constrained_decoding: bool = Field(
        True,
        description="Transformers engine: structured outputs (a grammar mask per constrained sequence). It runs the "
        "library's continuous batching without asynchronous batching (two steps in flight, chosen with CUDA graphs), "
        "which would hand the mask each token one step late; false keeps that mode and answers constrained requests "
        "errored (`invalid_request_error`, param `response_format`).",
    )
    max_preemptions: int = Field(
        2,
        ge=0,
        description="Transformers engine: times a running deferred request may be preempted for interactive or"
        " near-interactive work waiting on a full worker (it resumes later from its tokens; 0: never preempt;"
        " docs/workers.md#preemption).",
    )
    preemption_min_slack_ms: int = Field(
        60_000,
        **_MS,
        description="Transformers engine: a deferred request is preempted only while its deadline is at least this"
        " far beyond the time its tokens left take at the worker's current rate.",
    )
    prefix_cache: bool = Field(
        True,
        description="Keep the KV blocks of prompt prefixes for later requests (transformers: the library's block"
        " sharing; vllm: its prefix caching; simulated: its cache model) and publish what is kept to the batchers"
        " (docs/workers.md#prefix-caching).",
    )
    prefix_cache_budget_tokens: int = Field(
        8192,
        ge=0,
        description="Prompt tokens of cached prefixes a worker keeps beyond its running sequences (transformers on CPU:"
        " room added to its paged KV cache, within its byte cap; simulated: its cache model's size); blocks seen once go"
        " before blocks used again (a segmented LRU), least recently used first.",
    )
    prefix_cache_scope: Literal["tenant", "shared"] = Field(
        "tenant",
        description="Whose requests share cached prefixes: `tenant` (one tenant's only: a cache shared across tenants"
        " is a timing side channel, as vLLM's cache_salt says) or `shared` (every tenant's).",
    )
    prefix_summary_interval_ms: int = Field(
        1000,
        **_MS,
        description="How often a worker publishes what its prefix cache holds (a PrefixSummary on the heartbeats"
        " channel); each summary replaces the last.",
    )
    prefix_summary_max_blocks: int = Field(
        2048,
        ge=0,
        description="Prefix blocks a summary names at most, most recently used first (9 bytes each on the wire: 2,048"
        " make about 18 KiB).",
    )
    progress_interval_ms: int = Field(
        500,
        **_MS,
        description="How often a worker writes the tokens a non-streamed request generated since its last write"
        " (`llmq:progress:<id>`), so that another worker can continue it: the most a continuation recomputes. A"
        " stream's are written with each chunk.",
    )
    stream_log_max_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="The chunks a worker keeps of one resumable stream (`llmq:stream-log:<id>`), in encoded bytes per"
        " run (a chunk of one token takes about 130); past them a resume gets the rest of the text with the final"
        " result (0: none kept).",
    )
    prefill_ms_per_token: float = Field(
        0.0,
        ge=0,
        description="--prefill-ms-per-token: simulated: a batch takes its batch time plus this per prompt token not"
        " found in its prefix cache (0: every batch takes the batch time).",
    )
    id: str = Field("", description="--worker-id: this worker's id (qualified by the region).")
    partition: int | None = Field(None, ge=0, description="--partition: the partition of llmq.batches it serves.")
    model: str = Field("", description="--model: the model served, e.g. llmq-sim or llmq-tiny.")
    engine: Literal["", "simulated", "transformers", "vllm"] = Field(
        "", description="--engine: simulated, transformers or vllm."
    )
    batch_time_ms: int = Field(500, ge=0, description="--batch-time-ms: simulated: time of any batch.")
    max_batch_size: int | None = Field(
        None, ge=1, description="--max-batch-size: simulated: requests per batch (default: the model's)."
    )
    poison_marker: str | None = Field(
        None, description="--poison-marker: simulated, for tests: a batch whose prompt holds it fails."
    )
    model_path: str | None = Field(
        None,
        description="--model-path: transformers, vllm: HF causal-LM checkpoint dir (transformers default: the"
        " catalogue model's installed checkpoint, or llmq-tiny built in code).",
    )
    gguf_file: str | None = Field(
        None, description="--gguf-file: transformers: a GGUF file in the model path to serve."
    )
    max_concurrent_sequences: int | None = Field(
        None, ge=1, description="--max-concurrent-sequences: transformers, vllm: running sequences, at most."
    )
    max_batched_tokens: int | None = Field(
        None, ge=1, description="--max-batched-tokens: transformers, vllm: tokens per forward step, at most."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="--gpu-memory-utilization: vllm: share of GPU memory it may take."
    )
    device: str | None = Field(
        None, description="--device: transformers: torch device (default: cuda if available, else cpu)."
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="--metrics-port: Prometheus /metrics port (default: LLMQ_METRICS_PORT)."
    )


class RouterSettings(Group):
    """The result-router: producing results to Kafka reply topics."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_ROUTER_")
    reply_attempts: int = Field(
        4,
        ge=1,
        description="Result-router: tries of one Kafka reply before it is dead-lettered (a permanent error: one try).",
    )
    reply_backoff_ms: int = Field(
        250, ge=0, description="Result-router: wait before reply retry r: backoff * 2**(r-1)."
    )
    reply_metadata_timeout_ms: int = Field(
        1000,
        **_MS,
        description="Result-router: per try, how long a reply topic may take to appear in the broker's metadata.",
    )
    reply_retry_budget_ms: int = Field(
        2000,
        **_MS,
        description="Result-router: the tries of one Kafka reply (backoff waits and metadata waits) end within this much,"
        " then it is dead-lettered.",
    )
    reply_retry_streak_max: int = Field(
        3,
        ge=1,
        description="Result-router: after this many results in a row on an `llmq.results` partition ended unsent after "
        "retries, that partition tries each reply once until one goes out.",
    )
    topic_refresh_ms: int = Field(
        1000,
        **_MS,
        description="Result-router and batcher: the cluster's topics are listed at most this often; a reply topic "
        "missing from a listing newer than its result is dead-lettered at once (router), from one newer than its "
        "Kafka-direct request refused at entry (batcher).",
    )


class JobsSettings(Group):
    """Files and batch jobs (/v1/files, /v1/batches): the API pods take them, the result-routers drive them."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    files_url: str = Field(
        "var/files",
        description="File store: a local directory or an fsspec URL (`s3://bucket/prefix` needs `s3fs`); API pods and "
        "result-routers must share it.",
    )
    files_max_bytes: int = Field(200 * 1024 * 1024, ge=1, description="Largest upload (413 past it).")
    files_retention_s: int = Field(
        30 * 86_400, ge=1, description="How long uploads, output/error files and a finished job are kept."
    )
    files_tenant_max_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=0,
        description="A tenant's live uploads (its key's `file_storage_bytes` wins); past it 400 `storage_quota_exceeded`.",
    )
    batch_max_lines: int = Field(50_000, ge=1, description="Requests per input file.")
    batch_max_line_bytes: int = Field(1024 * 1024, ge=1, description="Bytes per input line.")
    batch_max_window_s: int = Field(7 * 86_400, ge=1, description="Longest `completion_window`.")
    batch_max_rounds: int = Field(3, ge=0, description="Retry rounds of a line whose error is retryable.")
    batch_retry_backoff_ms: int = Field(1000, ge=0, description="Wait before retry round r: backoff × 2^(r-1).")
    batch_in_flight_lines: int = Field(
        1024, ge=1, description="Lines of one job produced and not yet settled, at most."
    )
    batch_lease_ms: int = Field(
        5000, **_MS, description="A result-router's hold on a job it drives; another takes over once it lapses."
    )
    batch_tick_ms: int = Field(250, **_MS, description="How often the job driver steps its jobs.")
    batch_end_grace_ms: int = Field(
        5000, ge=0, description="After a cancel or the window's end, how long running lines may still finish."
    )
    batch_create_max_per_pod: int = Field(
        4, ge=1, description="Batch creates validating at once on one API pod; past it 429 with Retry-After."
    )
    batch_create_max_per_tenant: int = Field(
        2, ge=1, description="Batch creates of one tenant validating at once on one API pod; past it 429."
    )
    batch_job_max_result_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1,
        description="Result bytes one job's lines may leave in Redis (each line's largest result); past it 400 "
        "`batch_results_too_large`.",
    )
    batch_tenant_max_result_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="The same, for all of a tenant's running jobs together; past it 429 `batch_results_quota_exceeded` "
        "(400 `batch_results_too_large` for a job that could never fit).",
    )

    message_batch_max_requests: int = Field(
        100_000, ge=1, description="Requests per Message Batch (`POST /v1/messages/batches`, Anthropic's limit)."
    )
    message_batch_max_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="Bytes of a Message Batch's create body (Anthropic's limit; streamed, never held whole); 413 past "
        "it. Each request in it is at most `LLMQ_BATCH_MAX_LINE_BYTES`.",
    )
    message_batch_expiry_s: int = Field(
        86_400, ge=1, description="A Message Batch's `expires_at`: its creation plus this (Anthropic: 24 h)."
    )
    message_batch_retention_s: int = Field(
        29 * 86_400,
        ge=1,
        description="How long an ended Message Batch and its results are kept, then 404 (Anthropic: 29 days).",
    )

    @field_validator("batch_max_line_bytes")
    @classmethod
    def _line_fits_one_record(cls, value: int, info: ValidationInfo) -> int:
        return _fits_one_record(value, info, "such a line could not be one record of the batch-job log")


class ObservabilitySettings(Group):
    """Logging, tracing (llmq_core.tracing) and metrics (llmq_core.metrics) of every service."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Log level of every service (JSON lines on stderr)."
    )
    tracing_exporter: Literal["none", "console", "otlp", "file"] = Field(
        "none", description="None: no SDK, the hot path pays ~nothing."
    )
    tracing_otlp_endpoint: str = Field(
        "", description="Empty: the exporter's default (OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317)."
    )
    tracing_file_dir: str = Field(
        "var/traces", description='Exporter "file": one JSON line per span in <dir>/<service>-<pid>.jsonl.'
    )
    tracing_sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces recorded (a request's later hops follow its first)."
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Every service (API pods too: never on their API port): Prometheus /metrics on this port (0: off; "
        "flag --metrics-port).",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address the metrics server binds (0.0.0.0 where Prometheus scrapes pods)."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class SloSettings(Group):
    """The service-level targets `llmq slo` checks (exit 1 when one is missed); 0 leaves a figure without a target.
    Latencies are as the API pods measured them (accept to first token, accept to last byte), ms."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_SLO_")
    interactive_ttft_p95_ms: int = Field(1_000, ge=0, description="interactive: p95 time to first token at most.")
    interactive_latency_p95_ms: int = Field(0, ge=0, description="interactive: p95 total latency at most.")
    interactive_latency_p99_ms: int = Field(
        30_000, ge=0, description="interactive: p99 total latency at most (its default deadline)."
    )
    near_interactive_ttft_p95_ms: int = Field(0, ge=0, description="near_interactive: p95 time to first token at most.")
    near_interactive_latency_p95_ms: int = Field(0, ge=0, description="near_interactive: p95 total latency at most.")
    near_interactive_latency_p99_ms: int = Field(
        60_000, ge=0, description="near_interactive: p99 total latency at most (its default deadline)."
    )
    deferred_completed_by_deadline_ratio: float = Field(
        0.99,
        ge=0,
        le=1,
        description="deferred: share of finished requests that succeeded by their deadline at least (requests that "
        "errored for a client error are left out).",
    )


class RuntimeSettings(Group):
    """Every service process."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    shutdown_grace_s: float = Field(10.0, gt=0, description="SIGTERM drain bound of every service.")


class DevSettings(Group):
    """Local dev and test stacks (`llmq dev up`)."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_DEV_")
    redis_maxmemory_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1,
        description="`llmq dev up` / `make test`: the redis-server's `maxmemory` (policy `volatile-lru`); production "
        "Redis is configured by its operator.",
    )


G = TypeVar("G", bound=Group)


class _Group(Generic[G]):
    """A Settings attribute holding one group, read from the environment on first use (then kept)."""

    def __init__(self, group: type[G]) -> None:
        self.group = group

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Group[G]: ...
    @overload
    def __get__(self, obj: Settings, owner: type) -> G: ...
    def __get__(self, obj: Settings | None, owner: type) -> G | _Group[G]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = obj._read(self.group)  # kept: later reads find it in __dict__
        return value  # type: ignore[return-value]


class Settings:
    """Every group of settings, each read from the environment the first time it is used (see the module docstring).

    ``Settings(api={"max_body_bytes": 2000})``: groups given as field values (the rest of the group from the
    environment) or as group instances."""

    region = _Group(RegionSettings)
    kafka = _Group(KafkaSettings)
    redis = _Group(RedisSettings)
    api = _Group(ApiSettings)
    result_store = _Group(ResultStoreSettings)
    models = _Group(ModelsSettings)
    batcher = _Group(BatcherSettings)
    worker = _Group(WorkerSettings)
    router = _Group(RouterSettings)
    jobs = _Group(JobsSettings)
    observability = _Group(ObservabilitySettings)
    slo = _Group(SloSettings)
    runtime = _Group(RuntimeSettings)
    dev = _Group(DevSettings)

    GROUPS: ClassVar[tuple[str, ...]] = (
        "region", "kafka", "redis", "api", "result_store", "models", "batcher", "worker", "router", "jobs",
        "observability", "slo", "runtime", "dev",
    )  # fmt: skip

    def __init__(self, **groups: Group | Mapping[str, Any]) -> None:
        self._environ: Mapping[str, str] | None = None
        for name, value in groups.items():
            cls = self.group_class(name)
            self.__dict__[name] = value if isinstance(value, cls) else cls(**value)

    @classmethod
    def group_class(cls, name: str) -> type[Group]:
        """The group class of attribute ``name``; TypeError for a name that is no group."""
        attr = cls.__dict__.get(name)
        if not isinstance(attr, _Group):
            raise TypeError(f"Settings has no group {name!r} (groups: {', '.join(cls.GROUPS)})")
        return attr.group

    @classmethod
    def variables(cls) -> dict[str, tuple[str, str]]:
        """Every environment variable read, in group order: name -> (group, field), e.g. ``LLMQ_API_MAX_BODY_BYTES``
        -> ("api", "max_body_bytes"). Old names (:func:`old_names`) are not listed."""
        return {
            env_name(group, field): (name, field)
            for name in cls.GROUPS
            for group in [cls.group_class(name)]
            for field in group.model_fields
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Settings whose groups are read from ``environ`` instead of ``os.environ``."""
        settings = cls()
        settings._environ = dict(environ)
        return settings

    @classmethod
    def defaults(cls) -> Settings:
        """Every group at its defaults, the environment unread."""
        return cls(**{name: cls.group_class(name).model_construct() for name in cls.GROUPS})

    def _read(self, group: type[G]) -> G:
        token = _ENVIRON.set(self._environ)
        try:
            return group.from_env()  # type: ignore[return-value]
        finally:
            _ENVIRON.reset(token)

    def replace(self, **changes: Mapping[str, Any]) -> Settings:
        """A copy whose named groups have ``changes`` (field -> value) applied, validated."""
        copy = Settings(**{name: self.__dict__[name] for name in self.GROUPS if name in self.__dict__})
        copy._environ = self._environ
        for name, update in changes.items():
            current = getattr(self, name)
            copy.__dict__[name] = type(current)(**{**dict(current), **update})
        return copy

    def loaded(self) -> Iterator[str]:
        """The groups read so far."""
        return (name for name in self.GROUPS if name in self.__dict__)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{name}={self.__dict__[name]!r}' for name in self.loaded())})"


def secret(value: str, path: str) -> str:
    """A credential: the contents of file ``path`` (trailing newline dropped) when it is set, else ``value``."""
    if path:
        with open(path, encoding="utf-8") as file:
            return file.read().rstrip("\n")
    return value


def load_settings(*groups: str) -> Settings:
    """Settings from the environment with ``groups`` (default: all) read and validated now, the others when first used.
    Raises SettingsError naming each refused variable."""
    settings = Settings()
    for name in groups or Settings.GROUPS:
        getattr(settings, name)
    return settings

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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
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
    """What the records of one Kafka-direct producer's ingress topic speak for: one tenant and the classes it may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tenant_id: str
    classes: tuple[Literal["interactive", "near_interactive", "deferred"], ...] = TRAFFIC_CLASSES


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
        ids.DEFAULT_REGION, validation_alias="LLMQ_REGION", description="This region's name (lower-case DNS label)."
    )
    limit_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of a tenant's global rate limits this region enforces (the keys file's limits are global):"
        " no region asks another on the request path, so each holds its share; the shares of all regions should add"
        " up to 1.",
    )

    @field_validator("name")
    @classmethod
    def _region_name(cls, value: str) -> str:
        return ids.check_region(value)


class KafkaSettings(Group):
    """Kafka: connection, transport security (docs/security.md), topics, Kafka-direct producers, client tuning."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_KAFKA_")
    bootstrap_servers: str = Field("127.0.0.1:9092", min_length=1, description="Brokers, comma-separated host:port.")
    security_protocol: Literal["PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT", description="PLAINTEXT, SASL_SSL (SCRAM over TLS) or SSL (TLS; mTLS with a client certificate)."
    )
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism (security protocol SASL_SSL)."
    )
    sasl_username: str = Field("", description="This service's principal (one per role: api, batcher, worker, ...).")
    sasl_password: str = Field("", description="Its password.")
    sasl_password_file: str = Field("", description="File holding the password, read at start; wins over the password.")
    ssl_cafile: str = Field("", description="CA that signed the brokers' certificates (empty: the system's CAs).")
    ssl_certfile: str = Field("", description="Client certificate (mTLS, security protocol SSL).")
    ssl_keyfile: str = Field("", description="The client certificate's private key.")
    request_topic_partitions: int = Field(
        4, ge=1, description="Partitions of each llmq.requests.<class> topic.", json_schema_extra=was("LLMQ_REQUEST_TOPIC_PARTITIONS")
    )
    batch_topic_partitions: int = Field(
        16, ge=1, description="Partitions of llmq.batches: one worker each.", json_schema_extra=was("LLMQ_BATCH_TOPIC_PARTITIONS")
    )
    results_topic_partitions: int = Field(
        4, ge=1, description="Partitions of llmq.results.", json_schema_extra=was("LLMQ_RESULTS_TOPIC_PARTITIONS")
    )
    topic_replication_factor: int = Field(
        1,
        ge=1,
        description="Replicas of each llmq topic `llmq topics` creates (1: local and test stacks).",
        json_schema_extra=was("LLMQ_TOPIC_REPLICATION_FACTOR"),
    )
    reply_topic_prefixes: str = Field(
        "", description="Comma-separated prefixes a Kafka reply topic must start with (empty: any)."
    )
    request_id_ttl_s: int = Field(
        86400, gt=0, description="A Kafka-direct request_id is known this long: copies get its answer again."
    )
    ingress: dict[str, IngressGrant] = Field(
        {},
        description='Kafka-direct producers (JSON): principal -> {"tenant_id": ..., "classes": [...]}. The batcher'
        " reads each one's topic llmq.ingress.<principal> and answers a record claiming another tenant or class with"
        " an error.",
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
        " their fetches up to this long, or until results_fetch_min_bytes; reply topics and stored results lag by"
        " up to this.",
    )
    results_fetch_min_bytes: int = Field(64 * 1024, ge=1, description="See results_fetch_max_wait_ms.")
    topics_ready_timeout_s: float = Field(
        60,
        gt=0,
        description="Topic creation and consumer services wait at most this long for their topics to show a leader"
        " for every partition (a consumer subscribing before leaves the topic out for minutes).",
    )

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
    url: str = Field("redis://127.0.0.1:6379/0", min_length=1, description="redis:// or rediss:// (TLS) URL.")
    username: str = Field("", description="Redis ACL user (one per role); empty: the URL's, else Redis' default user.")
    password: str = Field("", description="Its password.")
    password_file: str = Field("", description="File holding the password, read at start; wins over the password.")
    ssl_cafile: str = Field("", description="CA of the Redis server's certificate (rediss:// URLs).")
    ssl_certfile: str = Field("", description="Client certificate, where Redis asks for one (tls-auth-clients).")
    ssl_keyfile: str = Field("", description="The client certificate's private key.")


_MS = {"ge": 1}


class ApiSettings(Group):
    """The API pods: the HTTP edge, admission, deadlines per class, API keys, pod heartbeats."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_API_")
    instance_id: str = Field(
        "", description="This pod's id (empty: hostname + random suffix).", json_schema_extra=was("LLMQ_INSTANCE_ID")
    )
    interactive_default_timeout_ms: int = Field(
        30_000,
        **_MS,
        description="Deadline of an interactive request without x-llmq-timeout-ms.",
        json_schema_extra=was("LLMQ_DEFAULT_TIMEOUT_MS"),
    )
    interactive_max_timeout_ms: int = Field(
        600_000,
        **_MS,
        description="Longest x-llmq-timeout-ms an interactive request may ask for.",
        json_schema_extra=was("LLMQ_MAX_TIMEOUT_MS"),
    )
    near_interactive_default_timeout_ms: int = Field(
        60_000,
        **_MS,
        description="Deadline of a near_interactive request without x-llmq-timeout-ms.",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_DEFAULT_TIMEOUT_MS"),
    )
    near_interactive_max_timeout_ms: int = Field(
        600_000,
        **_MS,
        description="Longest x-llmq-timeout-ms a near_interactive request may ask for.",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_MAX_TIMEOUT_MS"),
    )
    deferred_default_timeout_ms: int = Field(
        3_600_000,
        **_MS,
        description="Deadline of a deferred request without x-llmq-timeout-ms.",
        json_schema_extra=was("LLMQ_DEFERRED_DEFAULT_TIMEOUT_MS"),
    )
    deferred_max_timeout_ms: int = Field(
        86_400_000,
        **_MS,
        description="Longest x-llmq-timeout-ms a deferred request may ask for.",
        json_schema_extra=was("LLMQ_DEFERRED_MAX_TIMEOUT_MS"),
    )
    pod_heartbeat_interval_ms: int = Field(
        1000,
        **_MS,
        description="How often a pod refreshes its liveness key (the batchers check pods this often).",
        json_schema_extra=was("LLMQ_POD_HEARTBEAT_INTERVAL_MS"),
    )
    pod_heartbeat_ttl_ms: int = Field(
        5000,
        **_MS,
        description="A pod's liveness key lapses this long after its last heartbeat.",
        json_schema_extra=was("LLMQ_POD_HEARTBEAT_TTL_MS"),
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1, description="Larger request bodies get 413 (at most one Kafka record's payload)."
    )
    produce_timeout_ms: int = Field(
        2000, **_MS, description="Bound on producing one request to Kafka; past it the client gets 503."
    )
    max_in_flight: int = Field(10_000, ge=0, description="Waiters per pod; past it new requests get 429.")
    max_stop_bytes: int = Field(
        256, ge=1, description="UTF-8 bytes of one stop sequence; longer ones get 400 (param stop)."
    )
    kafka_breaker_backoff_ms: int = Field(
        1000,
        **_MS,
        description="Kafka circuit breaker: after a failed produce, requests get 503 at once for this long, then one"
        " probes; each failed probe doubles the wait up to kafka_breaker_max_backoff_ms.",
    )
    kafka_breaker_max_backoff_ms: int = Field(5000, **_MS, description="The breaker's longest wait.")
    kafka_check_interval_ms: int = Field(
        1000, **_MS, description="How often the pod checks that its Kafka client reaches a broker."
    )
    keys_file: str = Field(
        "", description="YAML/JSON: API key -> tenant, tier, classes, limits (see deploy/keys.example.yaml)."
    )
    dev_keys: bool = Field(
        True, description="Also accept llmq-dev-key (tenant dev, paid) and llmq-dev-free-key (tenant dev-free, free)."
    )
    shed_wait_ms: dict[str, int] = Field(
        dict(zip(PRIORITY_CLASSES, (15_000, 5_000, 2_000, 1_000), strict=True)),
        description="Admission, per priority class (JSON): predicted queue wait (ms) past which new requests get 429.",
    )
    shed_share: dict[str, float] = Field(
        dict(zip(PRIORITY_CLASSES, (0.95, 0.85, 0.7, 0.5), strict=True)),
        description="Admission, per priority class (JSON): the share of max_in_flight (this pod) and the batchers'"
        " max_queued a class may fill.",
    )
    saturation_stale_ms: int = Field(5000, **_MS, description="Batcher saturation reports older than this are ignored.")
    rate_limit_timeout_ms: int = Field(
        250,
        gt=0,
        description="A tenant's rate-limit check waits this long on Redis, then lets the request through (> 0: zero"
        " would let every request through unlimited, silently).",
    )
    header_timeout_ms: int = Field(
        10_000, **_MS, description="A request's headers must arrive within this; past it 408, closed."
    )
    body_timeout_ms: int = Field(
        300_000, **_MS, description="A request's body must arrive within this after its headers; past it 408."
    )
    keep_alive_timeout_ms: int = Field(5_000, **_MS, description="An idle kept-alive connection is closed after this.")
    max_connections_per_client: int = Field(
        1024, ge=0, description="Connections per client address; past it 429 and closed (0: no cap)."
    )
    max_header_bytes: int = Field(64 * 1024, ge=1, description="A request's line and headers; past it 431 and closed.")
    access_log: bool = Field(
        True, description="One log line per request: route, status, tenant, request id, latency (no bodies)."
    )
    trusted_proxies: str = Field(
        "", description="Comma-separated proxy addresses/networks: not capped; their X-Forwarded-For is used."
    )

    @field_validator("max_body_bytes")
    @classmethod
    def _body_fits_one_record(cls, value: int, info: ValidationInfo) -> int:
        return _fits_one_record(value, info, "such a request could not be produced to Kafka")


class ResultStoreSettings(Group):
    """Stored results (retrieval copies), written by the result-router and read by the API pods."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_RESULT_STORE_")
    ttl_s: int = Field(3600, ge=1, description="A stored result is kept this long.", json_schema_extra=was("LLMQ_RESULT_TTL_S"))
    tenant_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="Stored result bytes of one tenant; past it its oldest are dropped first."
    )
    tenant_max_results: int = Field(
        100_000, ge=1, description="Stored results of one tenant; past it its oldest are dropped first."
    )


class ModelsSettings(Group):
    """Models beyond the built-in catalogue, and where catalogue checkpoints live."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_MODELS_")
    extra: list[str] = Field(
        [],
        description="Models served besides the built-in catalogue (--model-path workers), JSON list: metric labels.",
        json_schema_extra=was("LLMQ_EXTRA_MODELS"),
    )
    tokenizers: dict[str, str] = Field(
        {},
        description="Model -> tokenizer.json (or a checkpoint directory holding it) of a model outside the catalogue"
        " (JSON): API pods and batchers count its tokens with it (others: the byte count, an upper bound).",
        json_schema_extra=was("LLMQ_MODEL_TOKENIZERS"),
    )
    dir: str = Field("~/.cache/llmq/models", description="Converted catalogue checkpoints: <dir>/<model>/.")


class BatcherSettings(Group):
    """The batcher: how long batches wait per class, queue bounds, fair share, worker liveness."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_BATCHER_")
    interactive_max_wait_ms: int = Field(
        0, ge=0, description="Longest an interactive request waits for its batch to fill.",
        json_schema_extra=was("LLMQ_INTERACTIVE_MAX_WAIT_MS"),
    )
    near_interactive_max_wait_ms: int = Field(
        50, ge=0, description="Longest a near_interactive request waits for its batch to fill.",
        json_schema_extra=was("LLMQ_NEAR_INTERACTIVE_MAX_WAIT_MS"),
    )
    deferred_max_wait_ms: int = Field(
        500, ge=0, description="Longest a deferred request waits for its batch to fill.",
        json_schema_extra=was("LLMQ_DEFERRED_MAX_WAIT_MS"),
    )
    fixed_engine_max_wait_ms: int = Field(
        20, ge=0, description="Longest a batch for a fixed-batch engine waits to fill.",
        json_schema_extra=was("LLMQ_FIXED_ENGINE_MAX_WAIT_MS"),
    )
    fixed_engine_busy_wait_ms: int = Field(
        10, ge=0, description="A batch waits at most this long for its model's running batch to end.",
        json_schema_extra=was("LLMQ_FIXED_ENGINE_BUSY_WAIT_MS"),
    )
    worker_heartbeat_timeout_ms: int = Field(
        2000,
        **_MS,
        description="A worker silent this long is gone (the batchers stop dispatching to it; admission stops counting"
        " it).",
        json_schema_extra=was("LLMQ_WORKER_HEARTBEAT_TIMEOUT_MS"),
    )
    max_queued: int = Field(100_000, ge=0, description="Requests queued in one batcher, at most.")
    deferred_reserved_share: float = Field(
        0.25, ge=0, lt=1, description="Share of each worker's slots deferred work never fills."
    )
    deferred_buffer_rounds: int = Field(
        2, ge=1, description="Deferred work read ahead: rounds of every live worker's unreserved slots."
    )
    tenant_max_inflight: int = Field(4096, ge=1, description="Dispatched, not yet finished requests per tenant.")
    tenant_weights: dict[str, float] = Field(
        {}, description="Fair-share weight per tenant_id (JSON); others weigh 1."
    )

    def max_wait_ms(self) -> dict[str, int]:
        """Traffic class -> its max wait (ms)."""
        return {
            "interactive": self.interactive_max_wait_ms,
            "near_interactive": self.near_interactive_max_wait_ms,
            "deferred": self.deferred_max_wait_ms,
        }


class WorkerSettings(Group):
    """A worker process. Its flags (``python -m llmq_worker.main --help``) win over these."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_WORKER_")
    heartbeat_interval_ms: int = Field(
        250, **_MS, description="How often a worker announces its load.", json_schema_extra=was("LLMQ_HEARTBEAT_INTERVAL_MS")
    )
    lease_ttl_ms: int = Field(
        10_000, **_MS, description="A partition's lease lapses this long after its worker stopped renewing it."
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description="transformers engine on CPU: torch intra-op threads (0: the measured default).",
        json_schema_extra=was("LLMQ_TORCH_THREADS"),
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
        4, ge=1, description="Tries of one reply before it is dead-lettered (permanent errors: one)."
    )
    reply_backoff_ms: int = Field(250, ge=0, description="Wait before retry r: backoff * 2**(r-1).")
    reply_metadata_timeout_ms: int = Field(
        1000, **_MS, description="Per try: how long a reply topic may take to show up in metadata."
    )
    reply_retry_budget_ms: int = Field(
        2000, **_MS, description="Tries of one reply (waits and metadata) end within this much."
    )
    reply_retry_streak_max: int = Field(
        3, ge=1, description="After this many results in a row ended unsent, a partition retries none."
    )
    topic_refresh_ms: int = Field(
        1000, **_MS, description="The cluster's topics are listed at most this often (missing reply topics)."
    )


class JobsSettings(Group):
    """Files and batch jobs (/v1/files, /v1/batches): the API pods take them, the result-routers drive them."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    files_url: str = Field(
        "var/files", description="File store: a local directory or any fsspec URL (s3://bucket/prefix, memory://...)."
    )
    files_max_bytes: int = Field(200 * 1024 * 1024, ge=1, description="Larger uploads get 413.")
    files_retention_s: int = Field(
        30 * 86_400, ge=1, description="Uploads, output and error files (and a finished job's ledger) live this long."
    )
    files_tenant_max_bytes: int = Field(
        1024 * 1024 * 1024, ge=0, description="A tenant's live uploads, unless its key sets file_storage_bytes."
    )
    batch_max_lines: int = Field(50_000, ge=1, description="Requests per input file.")
    batch_max_line_bytes: int = Field(
        1024 * 1024, ge=1, description="Bytes per input line (at most one Kafka record's payload)."
    )
    batch_max_window_s: int = Field(7 * 86_400, ge=1, description="Longest completion_window accepted.")
    batch_max_rounds: int = Field(
        3, ge=0, description="Retries of a line whose error is retryable, after its first run."
    )
    batch_retry_backoff_ms: int = Field(1000, ge=0, description="Wait before retry round r: backoff * 2**(r-1).")
    batch_in_flight_lines: int = Field(1024, ge=1, description="Lines of one job produced and not yet settled, at most.")
    batch_lease_ms: int = Field(
        5000, **_MS, description="A result-router's hold on a job it drives; another takes over once it lapses."
    )
    batch_tick_ms: int = Field(250, **_MS, description="How often the job driver looks at its jobs.")
    batch_end_grace_ms: int = Field(
        5000, ge=0, description="After a cancel or the window's end: wait this long for in-flight lines."
    )
    batch_create_max_per_pod: int = Field(
        4, ge=1, description="Batch creates validating at once on one API pod; past it 429."
    )
    batch_create_max_per_tenant: int = Field(2, ge=1, description="... of one tenant on one API pod.")
    batch_job_max_result_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1,
        description="Result bytes one job's ledger may hold in Redis (never evicted while it runs); past it 400"
        " batch_results_too_large.",
    )
    batch_tenant_max_result_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="Result bytes a tenant's running jobs may hold together; past it 429."
    )

    @field_validator("batch_max_line_bytes")
    @classmethod
    def _line_fits_one_record(cls, value: int, info: ValidationInfo) -> int:
        return _fits_one_record(value, info, "such a line could not be one record of the batch-job log")


class ObservabilitySettings(Group):
    """Logging, tracing (llmq_core.tracing) and metrics (llmq_core.metrics) of every service."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field("INFO", description="Log level.")
    tracing_exporter: Literal["none", "console", "otlp", "file"] = Field(
        "none", description="none (no SDK: the hot path pays about nothing), console, otlp or file."
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
        0, ge=0, le=65535, description="Prometheus /metrics on this port (0: off; flag --metrics-port wins)."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address the metrics server binds (0.0.0.0 where Prometheus scrapes pods)."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class RuntimeSettings(Group):
    """Every service process."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_")
    shutdown_grace_s: float = Field(10.0, gt=0, description="On SIGTERM, a service drains within this long.")


class DevSettings(Group):
    """Local dev and test stacks (`llmq dev up`)."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_DEV_")
    redis_maxmemory_bytes: int = Field(
        512 * 1024 * 1024, ge=1, description="The stack's redis-server maxmemory (volatile-lru past it)."
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
    runtime = _Group(RuntimeSettings)
    dev = _Group(DevSettings)

    GROUPS: ClassVar[tuple[str, ...]] = (
        "region", "kafka", "redis", "api", "result_store", "models", "batcher", "worker", "router", "jobs",
        "observability", "runtime", "dev",
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


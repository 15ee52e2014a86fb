"""Settings of every llmq service, from environment variables ``LLMQ_<NAME>`` (e.g. ``LLMQ_REDIS_URL``).

README.md's configuration table lists them; keep the two together.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmq_core import ids
from llmq_core.constants import KAFKA_MAX_MESSAGE_BYTES, PRIORITY_CLASSES, RECORD_HEADROOM_BYTES, TRAFFIC_CLASSES

# A Kafka principal's name becomes a topic name (constants.ingress_topic): only what a topic name may hold
_PRINCIPAL_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_ONE_RECORD = {  # what a limit past one Kafka record would break, by setting
    "api_max_body_bytes": "such a request could not be produced to Kafka",
    "batch_max_line_bytes": "such a line could not be one record of the batch-job log",
}


class IngressGrant(BaseModel):
    """What the records of one Kafka-direct producer's ingress topic speak for: one tenant and the classes it may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tenant_id: str
    classes: tuple[Literal["interactive", "near_interactive", "deferred"], ...] = TRAFFIC_CLASSES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    # region (README "Multi-region"): in every instance, request, batch and batch-job id, metric and log line
    region: str = ids.DEFAULT_REGION
    # share of a tenant's global rate limits this region enforces (its keys-file limits are global): no region asks
    # another on the request path, so each holds its share; the shares of all regions should add up to 1
    region_limit_share: float = 1.0

    # connections
    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # transport security (docs/security.md): PLAINTEXT | SASL_SSL (SCRAM over TLS) | SSL (TLS, mTLS with a client cert)
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    kafka_sasl_username: str = ""  # this service's principal (one per role: api, batcher, worker, router, admin)
    kafka_sasl_password: str = ""
    kafka_sasl_password_file: str = ""  # read at start when set (a mounted secret); wins over kafka_sasl_password
    kafka_ssl_cafile: str = ""  # CA that signed the brokers' certificates (empty: the system's CAs)
    kafka_ssl_certfile: str = ""  # client certificate (mTLS, security protocol SSL)
    kafka_ssl_keyfile: str = ""  # its private key
    redis_username: str = ""  # Redis ACL user (one per role); empty: the URL's, else Redis' default user
    redis_password: str = ""
    redis_password_file: str = ""  # read at start when set; wins over redis_password
    redis_ssl_cafile: str = ""  # CA of the Redis server's certificate (rediss:// URLs)
    redis_ssl_certfile: str = ""  # client certificate, where Redis asks for one (tls-auth-clients)
    redis_ssl_keyfile: str = ""

    # topics
    request_topic_partitions: int = 4
    batch_topic_partitions: int = 16
    results_topic_partitions: int = 4
    kafka_reply_topic_prefixes: str = ""  # comma-separated prefixes a Kafka reply topic must start with (empty: any)
    kafka_request_id_ttl_s: int = 86400  # a Kafka-direct request_id is known this long: copies get its answer again
    # Kafka-direct producers (JSON): principal -> {"tenant_id": ..., "classes": [...]}; the batcher reads each one's
    # topic constants.ingress_topic(principal) and answers a record claiming another tenant or class errored
    kafka_ingress: dict[str, IngressGrant] = {}
    topic_replication_factor: int = 1  # replicas of each llmq topic `llmq topics` creates (1: local and test stacks)

    # api
    instance_id: str = ""  # empty: generated at start (hostname + random suffix)
    default_timeout_ms: int = 30_000
    max_timeout_ms: int = 600_000
    result_ttl_s: int = 3600
    # stored results of one tenant (retrieval copies); past either bound the tenant's oldest are dropped first
    result_store_tenant_max_bytes: int = 64 * 1024 * 1024
    result_store_tenant_max_results: int = 100_000
    pod_heartbeat_interval_ms: int = 1000
    pod_heartbeat_ttl_ms: int = 5000
    api_max_body_bytes: int = 4 * 1024 * 1024  # larger request bodies get 413
    api_produce_timeout_ms: int = 2000  # bound on producing one request to Kafka; past it the client gets 503
    api_max_in_flight: int = 10_000  # waiters per pod; past it new requests get 429
    api_max_stop_bytes: int = 256  # UTF-8 bytes of one stop sequence; longer ones get 400 (param stop)
    # Kafka circuit breaker (llmq_api.health): after a failed produce, requests get 503 at once for this long, then one
    # probes; each failed probe doubles the wait up to the maximum
    api_kafka_breaker_backoff_ms: int = 1000
    api_kafka_breaker_max_backoff_ms: int = 5000
    api_kafka_check_interval_ms: int = 1000  # how often the pod checks that its Kafka client reaches a broker
    # per-class deadlines (x-llmq-timeout-ms); interactive uses default_timeout_ms / max_timeout_ms above
    near_interactive_default_timeout_ms: int = 60_000
    near_interactive_max_timeout_ms: int = 600_000
    deferred_default_timeout_ms: int = 3_600_000
    deferred_max_timeout_ms: int = 86_400_000
    api_keys_file: str = ""  # YAML/JSON: API key -> tenant, tier, classes, limits (see deploy/keys.example.yaml)
    api_dev_keys: bool = (
        True  # also accept llmq-dev-key (tenant dev, paid) and llmq-dev-free-key (tenant dev-free, free)
    )
    # admission, per PRIORITY_CLASSES entry: predicted queue wait (ms) past which new requests get 429 ...
    api_shed_wait_ms: dict[str, int] = dict(zip(PRIORITY_CLASSES, (15_000, 5_000, 2_000, 1_000), strict=True))
    # ... and the share of api_max_in_flight (this pod) and batcher_max_queued (the batchers) a class may fill
    api_shed_share: dict[str, float] = dict(zip(PRIORITY_CLASSES, (0.95, 0.85, 0.7, 0.5), strict=True))
    api_saturation_stale_ms: int = 5000  # batcher saturation reports older than this are ignored
    api_rate_limit_timeout_ms: int = 250  # a tenant's rate-limit check waits this long on Redis, then lets through
    # connections (llmq_api.connections): meant for direct exposure; behind a proxy its own limits apply
    api_header_timeout_ms: int = 10_000  # a request's headers must arrive within this; past it 408, closed
    api_body_timeout_ms: int = 300_000  # a request's body must arrive within this after its headers; past it 408
    api_keep_alive_timeout_ms: int = 5_000  # an idle kept-alive connection is closed after this
    api_max_connections_per_client: int = 1024  # connections per client address; past it 429 and closed (0: no cap)
    api_max_header_bytes: int = 64 * 1024  # a request's line and headers; past it 431 and closed
    api_access_log: bool = True  # one log line per request: route, status, tenant, request id, latency (no bodies)
    api_trusted_proxies: str = ""  # comma-separated proxy addresses/networks: not capped; their X-Forwarded-For is used
    extra_models: list[str] = []  # models served besides the built-in catalogue (--model-path workers): metric labels
    # model -> tokenizer.json (or a checkpoint directory holding it) of a model outside the catalogue: API pods and
    # batchers count its tokens with it (others: the byte count, an upper bound)
    model_tokenizers: dict[str, str] = {}
    models_dir: str = (
        "~/.cache/llmq/models"  # converted catalogue checkpoints: <dir>/<model>/ (llmq_worker.checkpoints)
    )

    # batcher
    interactive_max_wait_ms: int = 0
    near_interactive_max_wait_ms: int = 50
    deferred_max_wait_ms: int = 500
    fixed_engine_max_wait_ms: int = 20
    fixed_engine_busy_wait_ms: int = 10  # a batch waits at most this long for its model's running batch to end
    worker_heartbeat_timeout_ms: int = 2000
    batcher_max_queued: int = 100_000
    batcher_deferred_reserved_share: float = 0.25  # share of each worker's slots deferred work never fills
    batcher_deferred_buffer_rounds: int = 2  # deferred work read ahead: rounds of every live worker's unreserved slots
    batcher_tenant_max_inflight: int = 4096  # dispatched, not yet finished requests per tenant
    batcher_tenant_weights: dict[str, float] = {}  # fair-share weight per tenant_id (JSON in env); others weigh 1

    # worker
    heartbeat_interval_ms: int = 250
    worker_lease_ttl_ms: int = 10_000  # a partition's lease lapses this long after its worker stopped renewing it
    torch_threads: int = 0  # transformers engine on CPU: torch intra-op threads (0: the measured default, see README)

    # result-router: producing to Kafka reply topics
    router_reply_attempts: int = 4  # tries of one reply before it is dead-lettered (permanent errors: one)
    router_reply_backoff_ms: int = 250  # wait before retry r: backoff * 2**(r-1)
    router_reply_metadata_timeout_ms: int = 1000  # per try: how long a reply topic may take to show up in metadata
    router_reply_retry_budget_ms: int = 2000  # tries of one reply (waits and metadata) end within this much
    router_reply_retry_streak_max: int = 3  # after this many results in a row ended unsent, a partition retries none
    router_topic_refresh_ms: int = 1000  # the cluster's topics are listed at most this often (missing reply topics)

    # batch jobs (/v1/files, /v1/batches; the ledger and driver run in the result-router)
    files_url: str = "var/files"  # file store: a local directory or any fsspec URL (s3://bucket/prefix, memory://...)
    files_max_bytes: int = 200 * 1024 * 1024  # larger uploads get 413
    files_retention_s: int = 30 * 86_400  # uploads, output and error files (and a finished job's ledger) live this long
    batch_max_lines: int = 50_000  # requests per input file
    batch_max_line_bytes: int = 1024 * 1024  # bytes per input line
    batch_max_window_s: int = 7 * 86_400  # longest completion_window accepted
    batch_max_rounds: int = 3  # retries of a line whose error is retryable, after its first run
    batch_retry_backoff_ms: int = 1000  # wait before retry round r: backoff * 2**(r-1)
    batch_in_flight_lines: int = 1024  # lines of one job produced and not yet settled, at most
    batch_lease_ms: int = 5000  # a result-router's hold on a job it drives; another takes over once it lapses
    batch_tick_ms: int = 250  # how often the job driver looks at its jobs
    batch_end_grace_ms: int = 5000  # after a cancel or the window's end: wait this long for in-flight lines
    files_tenant_max_bytes: int = 1024 * 1024 * 1024  # a tenant's live uploads, unless its key sets file_storage_bytes
    batch_create_max_per_pod: int = 4  # batch creates validating at once on one API pod; past it 429
    batch_create_max_per_tenant: int = 2  # ... of one tenant on one API pod
    # Result bytes a job's ledger may hold in Redis (never evicted while the job runs), from each line's largest result
    batch_job_max_result_bytes: int = 128 * 1024 * 1024  # one job; past it 400 batch_results_too_large
    batch_tenant_max_result_bytes: int = 256 * 1024 * 1024  # a tenant's running jobs together; past it 429

    # ops
    dev_redis_maxmemory_bytes: int = 512 * 1024 * 1024  # the dev/test stack's redis-server (volatile-lru past it)
    log_level: str = "INFO"
    shutdown_grace_s: float = 10.0

    # observability (llmq_core.tracing, llmq_core.metrics)
    tracing_exporter: Literal["none", "console", "otlp", "file"] = "none"  # none: no SDK, the hot path pays ~nothing
    tracing_otlp_endpoint: str = ""  # empty: the exporter's default (OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317)
    tracing_file_dir: str = "var/traces"  # exporter "file": one JSON line per span in <dir>/<service>-<pid>.jsonl
    tracing_sample_ratio: float = 1.0  # share of new traces recorded (a request's later hops follow its first)
    metrics_port: int = (
        0  # batcher, worker, result-router: Prometheus /metrics on this port (0: off; flag --metrics-port)
    )
    metrics_host: str = "127.0.0.1"  # address the metrics server binds (0.0.0.0 where Prometheus scrapes pods)

    @field_validator("kafka_ingress")
    @classmethod
    def _principals_name_topics(cls, value: dict[str, IngressGrant]) -> dict[str, IngressGrant]:
        """Each principal names its ingress topic: refuse to start with one no topic could be named after."""
        bad = [p for p in value if not _PRINCIPAL_RE.fullmatch(p)]
        if bad:
            raise ValueError(f"kafka_ingress principals {bad} must be 1-200 characters of A-Z a-z 0-9 . _ -")
        return value

    @field_validator("region")
    @classmethod
    def _region_name(cls, value: str) -> str:
        return ids.check_region(value)

    @field_validator("region_limit_share")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(f"region_limit_share {value} must be in (0, 1]")
        return value

    @field_validator("api_rate_limit_timeout_ms")
    @classmethod
    def _positive_timeout(cls, value: int, info: ValidationInfo) -> int:
        """A zero or negative timeout would let every request through unlimited, silently: refuse to start."""
        if value <= 0:
            raise ValueError(f"{info.field_name} {value} must be > 0 (ms)")
        return value

    @field_validator("batch_max_line_bytes", "api_max_body_bytes")
    @classmethod
    def _fits_one_record(cls, value: int, info: ValidationInfo) -> int:
        """A request body travels in one Kafka record, and a batch line is one record of llmq.jobs.lines (never
        split): refuse to start with a limit no record could carry."""
        most = KAFKA_MAX_MESSAGE_BYTES - RECORD_HEADROOM_BYTES
        if value > most:
            raise ValueError(
                f"{info.field_name} {value} exceeds {most} bytes (KAFKA_MAX_MESSAGE_BYTES minus"
                f" RECORD_HEADROOM_BYTES): {_ONE_RECORD[info.field_name]}"
            )
        return value


def secret(value: str, path: str) -> str:
    """A credential: the contents of file ``path`` (trailing newline dropped) when it is set, else ``value``."""
    if path:
        with open(path, encoding="utf-8") as file:
            return file.read().rstrip("\n")
    return value


def load_settings() -> Settings:
    """Settings from the environment (``LLMQ_*``), with the defaults above."""
    return Settings()

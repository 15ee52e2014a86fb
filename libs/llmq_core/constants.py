"""Every Kafka topic, Redis key and header name llmq uses, in one place."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final

# --- traffic classes and tiers (highest priority first) ---
INTERACTIVE: Final = "interactive"
NEAR_INTERACTIVE: Final = "near_interactive"
DEFERRED: Final = "deferred"
TRAFFIC_CLASSES: Final = (INTERACTIVE, NEAR_INTERACTIVE, DEFERRED)
TIER_PAID: Final = "paid"
TIER_FREE: Final = "free"
TIERS: Final = (TIER_PAID, TIER_FREE)


def priority_class(traffic_class: str, tier: str) -> str:
    """A request's entry in PRIORITY_CLASSES: interactive traffic splits by tier, the other classes do not."""
    return f"{traffic_class}:{tier}" if traffic_class == INTERACTIVE else traffic_class


# Admission priorities, most important first: under overload the last one is shed first.
PRIORITY_CLASSES: Final = tuple(dict.fromkeys(priority_class(c, t) for c in TRAFFIC_CLASSES for t in TIERS))


# --- Kafka topics ---
TOPIC_REQUESTS_PREFIX: Final = "llmq.requests."
TOPIC_BATCHES: Final = "llmq.batches"
TOPIC_RESULTS: Final = "llmq.results"
TOPIC_DEAD_LETTERS: Final = "llmq.dead-letters"
TOPIC_JOBS_PREFIX: Final = (
    "llmq.jobs."  # batch-job state: mirrored to the peer region (docs/operations/multi-region.md)
)
TOPIC_PREFIX: Final = "llmq."  # every llmq topic: never a reply topic
# MirrorMaker 2's heartbeats (each flow into a cluster writes its own there; mirrored to the peer as <region>.heartbeats)
TOPIC_MM2_HEARTBEATS: Final = "heartbeats"
KAFKA_INTERNAL_TOPIC_PREFIX: Final = "__"  # Kafka's own topics (__consumer_offsets, __transaction_state)


def requests_topic(traffic_class: str) -> str:
    """Kafka topic that carries GenerationRequests of one traffic class, e.g. ``llmq.requests.interactive``."""
    return f"{TOPIC_REQUESTS_PREFIX}{traffic_class}"


REQUEST_TOPICS: Final = tuple(requests_topic(c) for c in TRAFFIC_CLASSES)


# Every peer region's llmq.results as MirrorMaker 2 copies it here (``<region>.llmq.results``; see remote_topic)
PEER_RESULTS_PATTERN: Final = r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.llmq\.results$"


def remote_topic(source_region: str, topic: str) -> str:
    """Where MirrorMaker 2 (DefaultReplicationPolicy) copies ``topic`` of region ``source_region`` in the peer
    region, e.g. ``a.llmq.results``."""
    return f"{source_region}.{topic}"


TOPIC_INGRESS_PREFIX: Final = "llmq.ingress."


def ingress_topic(principal: str) -> str:
    """Kafka topic one Kafka-direct producer (Kafka principal ``principal``) writes its GenerationRequests to, e.g.
    ``llmq.ingress.acme``: only that principal may write it (ACLs), so its records speak for the tenant
    Settings.kafka.ingress maps it to."""
    return f"{TOPIC_INGRESS_PREFIX}{principal}"


def ingress_group(principal: str) -> str:
    """The one consumer group a Kafka-direct producer (principal ``principal``) may read its reply topics in (secure
    clusters: its ACLs): the principal's own name."""
    return principal


# Batch-job state (llmq_jobs.joblog): the source of truth of every job, mirrored to the peer region by MirrorMaker 2
# (DefaultReplicationPolicy: region a's llmq.jobs.specs is a.llmq.jobs.specs in region b); Redis holds a view of it.
# Compacted, one partition each (the rebuild reads them in the order written). Keys: batch id (specs, owners),
# "<batch id>:<custom_id>" (lines, ledger). Their prefix: TOPIC_JOBS_PREFIX.
JOB_TOPIC_KINDS: Final = ("specs", "lines", "ledger", "owners")


def job_topic(kind: str) -> str:
    """This region's job topic of ``kind`` (one of :data:`JOB_TOPIC_KINDS`), e.g. ``llmq.jobs.owners``."""
    return f"{TOPIC_JOBS_PREFIX}{kind}"


# --- Kafka consumer groups ---
GROUP_BATCHER: Final = "llmq-batcher"
GROUP_RESULT_ROUTER: Final = "llmq-result-router"
GROUP_PEER_RESULTS: Final = "llmq-result-router-peers"  # result-routers over the peers' mirrored results
GROUP_WORKER_PREFIX: Final = "llmq-worker-"


def worker_group(partition: int) -> str:
    """Consumer group that stores a worker's committed offset of its llmq.batches partition."""
    return f"{GROUP_WORKER_PREFIX}{partition}"


# --- Kafka client tuning: the deployment knobs are settings (llmq_core.settings.KafkaSettings: linger, batch bytes,
# the results consumers' fetch wait, the topics-ready bound).
# Consumers commit offsets at most this often (plus at shutdown and on revocation): a commit costs the broker several
# times a produced record, so one per record or batch dominated its CPU. What a crash redoes is bounded by this window;
# only delivered results are ever committed, and redelivered work is deduplicated by request_id.
KAFKA_COMMIT_INTERVAL_MS: Final = 200
KAFKA_TOPICS_READY_POLL_S: Final = 0.1


# --- Kafka headers ---
HEADER_CONTENT_TYPE: Final = "content-type"
HEADER_TRACEPARENT: Final = "traceparent"
CONTENT_TYPE_MSGPACK: Final = "application/msgpack"
CONTENT_TYPE_JSON: Final = "application/json"
HEADER_ERROR: Final = "x-llmq-error"  # on a dead letter: why it is one
HEADER_REPLY_TOPIC: Final = "x-llmq-reply-topic"  # on a dead-lettered result: the reply topic it could not reach
# on a Kafka reply: one id per answer (a request's, or a re-produced copy's), the router's proof of a produce
HEADER_DELIVERY: Final = "x-llmq-delivery"
HEADER_ERROR_MAX_BYTES: Final = 512  # a dead letter's HEADER_ERROR is cut to this

# --- prefix identity (llmq_core.prefixes): workers and batchers must agree, so these are wire constants ---
PREFIX_BLOCK_BYTES: Final = 128  # bytes of prompt per block of a prefix chain
PREFIX_MAX_BLOCKS: Final = 128  # blocks a chain holds at most (the first 16 KiB of a prompt)

# --- Redis channels and keys ---
REDIS_REPLIES_PREFIX: Final = "llmq:replies:"
REDIS_HEARTBEATS_CHANNEL: Final = "llmq:heartbeats"
REDIS_CANCELS_CHANNEL: Final = "llmq:cancels"
REDIS_RESULT_PREFIX: Final = "llmq:results:"
REDIS_DELIVERED_PREFIX: Final = "llmq:delivered:"
REDIS_POD_PREFIX: Final = "llmq:pods:"
REDIS_STATS_PREFIX: Final = "llmq:stats:"
REDIS_ALIVE_PREFIX: Final = "llmq:alive:"
STATS_BATCHER: Final = (
    "llmq:stats:batcher"  # hash: batches, requests (also per model: "batches:<model>"), flush_<reason>
)
REDIS_SATURATION_KEY: Final = "llmq:saturation"  # hash: batcher id -> wire.BatcherSaturation (msgpack), about 1/s
# Each batcher rewrites its saturation report (and its stats) at least this often; API pods count staleness in these.
SATURATION_REPORT_INTERVAL_MS: Final = 1000
REDIS_UNFINISHED_KEY: Final = "llmq:unfinished"  # hash: API pod id -> wire.PodUnfinished (msgpack), about 10/s
REDIS_RATELIMIT_PREFIX: Final = "llmq:ratelimit:"
REDIS_IDEMPOTENCY_PREFIX: Final = "llmq:idempotency:"
# Not under REDIS_RESULT_PREFIX: request ids of Kafka-direct producers are free text and could name these keys.
REDIS_RESULT_INDEX_PREFIX: Final = "llmq:result-index:"
REDIS_RESULT_BYTES_PREFIX: Final = "llmq:result-bytes:"
REDIS_REQUEST_COPY_PREFIX: Final = "llmq:request-copy:"
REDIS_STREAMED_PREFIX: Final = "llmq:streamed:"
REDIS_PROGRESS_PREFIX: Final = "llmq:progress:"
REDIS_STREAM_LOG_PREFIX: Final = "llmq:stream-log:"
REDIS_STREAM_HOLDER_PREFIX: Final = "llmq:stream-holder:"
REDIS_WORKER_LEASE_PREFIX: Final = "llmq:worker-lease:"  # + partition of llmq.batches: the worker that serves it
# + worker_id: its capacity ledger (hash: max_slots, fixed, batch_time_ms, running, queued, ends_ms), written by the
# worker; + worker_id + ":grants" (hash: batch_id -> "<requests>:<expires ms>"), claimed by batchers (llmq_batcher.ledger)
REDIS_CAPACITY_PREFIX: Final = "llmq:capacity:"
# batch jobs and their files (llmq_jobs.jobs, llmq_jobs.store)
REDIS_FILES_PREFIX: Final = "llmq:files:"
REDIS_JOBS_PREFIX: Final = "llmq:jobs:"
ACTIVE_JOBS_KEY: Final = "llmq:jobs:active"  # set of batch ids the result-routers drive
FILE_EXPIRY_KEY: Final = "llmq:files:expiry"  # zset: file id by expires_at (s); the sweep deletes stored objects
# zset: ended batch id by the epoch s its record goes. Swept, not a TTL: keys without one are never evicted (volatile-lru)
JOB_EXPIRY_KEY: Final = "llmq:jobs:expiry"


def _keys(prefix: str, suffix: str = "") -> Callable[[str], str]:
    """The builder of one family of Redis keys and channels: ``prefix + id + suffix``."""

    def key(name: str) -> str:
        return f"{prefix}{name}{suffix}"

    return key


# One line a family: what the key holds, and what names it.
replies_channel = _keys(REDIS_REPLIES_PREFIX)  # pub/sub of an API pod: chunks and results of the requests it holds
result_key = _keys(REDIS_RESULT_PREFIX)  # a stored FinalResult (msgpack) by request_id, kept for result_ttl_s
# zset of a tenant's stored results: members "<bytes>:<request_id>" scored by the epoch ms they were stored (oldest first
# out past result_store_tenant_max_bytes); it expires with the newest of them
result_index_key = _keys(REDIS_RESULT_INDEX_PREFIX)
result_bytes_key = _keys(REDIS_RESULT_BYTES_PREFIX)  # counter: the bytes of a tenant's results result_index_key lists
delivered_key = _keys(REDIS_DELIVERED_PREFIX)  # set once a request's result reached its Kafka reply topic: no duplicate
request_copy_key = _keys(REDIS_REQUEST_COPY_PREFIX)  # the Kafka position of the first record with a request_id
streamed_key = _keys(REDIS_STREAMED_PREFIX)  # a streaming request whose text reached its caller (wire.StreamMark)
progress_key = _keys(REDIS_PROGRESS_PREFIX)  # list: the wire.Progress frames of a running request's generated tokens
stream_log_key = _keys(REDIS_STREAM_LOG_PREFIX)  # list: the wire.TokenChunks of a resumable stream, as published
# string "<instance_id> <token>": the API pod connection that last resumed a stream (none: its first pod holds it)
stream_holder_key = _keys(REDIS_STREAM_HOLDER_PREFIX)
pod_key = _keys(REDIS_POD_PREFIX)  # exists while the API pod instance_id is alive (its heartbeat refreshes it)
file_key = _keys(REDIS_FILES_PREFIX)  # string: a FileRecord (JSON), expiring with the file
# zsets (lex order, score 0) of a tenant's files and jobs: members "<created_ms:015>:<id>" (jobs.listing_member)
tenant_files_key = _keys(f"{REDIS_FILES_PREFIX}tenant:")
tenant_jobs_key = _keys(f"{REDIS_JOBS_PREFIX}tenant:")
tenant_message_batches_key = _keys(f"{REDIS_JOBS_PREFIX}tenant-messages:")  # the same, of its Message Batches
tenant_storage_key = _keys(f"{REDIS_FILES_PREFIX}tenant:", ":bytes")  # integer: bytes of a tenant's live uploads
# integer: the most result bytes the ledgers of a tenant's running jobs may hold (reserved at create)
tenant_result_bytes_key = _keys(f"{REDIS_JOBS_PREFIX}tenant:", ":result-bytes")
# hash of a job by batch_id: spec (JSON JobSpec), status, at:<status> (epoch s), errors (JSON), jobs.COUNTERS, cursor,
# end_ms, result_bytes (reserved in tenant_result_bytes_key until the ledger is dropped)
job_key = _keys(REDIS_JOBS_PREFIX)
job_lines_key = _keys(REDIS_JOBS_PREFIX, ":lines")  # hash: custom_id -> ledger state (see llmq_jobs.jobs)
job_offsets_key = _keys(REDIS_JOBS_PREFIX, ":offsets")  # hash: custom_id -> "<start>:<end>" in the prepared file
job_results_key = _keys(REDIS_JOBS_PREFIX, ":results")  # hash: custom_id -> terminal wire.FinalResult (msgpack)
job_retries_key = _keys(REDIS_JOBS_PREFIX, ":retries")  # zset: custom_id by the epoch ms its retry round is due
job_lease_key = _keys(REDIS_JOBS_PREFIX, ":lease")  # string: token of the result-router driving it (PX batch_lease_ms)
# job hash fields owner_region, owner_epoch: the highest claim on the job known here (llmq_jobs.joblog.OwnerView)


def copy_delivered_key(request_id: str, request_copy: str) -> str:
    """Like :func:`delivered_key`, for the answer to one re-produced copy of a request (``FinalResult.request_copy``)."""
    return f"{REDIS_DELIVERED_PREFIX}{request_id}\n{request_copy}"


def alive_key(service: str, instance: str) -> str:
    """Redis key a running service process refreshes (PX ttl) with its latest heartbeat: ``llmq dev status`` reads it."""
    return f"{REDIS_ALIVE_PREFIX}{service}:{instance}"


def worker_lease_key(partition: int) -> str:
    """Redis key (PX ttl) naming the one worker that serves ``partition`` of llmq.batches (llmq_worker.lease)."""
    return f"{REDIS_WORKER_LEASE_PREFIX}{partition}"


def ratelimit_key(tenant_id: str, bucket: str) -> str:
    """Redis hash of one tenant's token bucket (``bucket``: ``requests`` or ``tokens``), shared by every API pod."""
    return f"{REDIS_RATELIMIT_PREFIX}{tenant_id}:{bucket}"


def idempotency_key(tenant_id: str, key: str) -> str:
    """Redis key of a tenant's ``Idempotency-Key`` claim (hashed: client keys are arbitrary text)."""
    return f"{REDIS_IDEMPOTENCY_PREFIX}{_digest(tenant_id, key)}"


def batch_idempotency_key(tenant_id: str, key: str) -> str:
    """String: the batch id a tenant's ``Idempotency-Key`` on ``POST /v1/batches`` created."""
    return f"{REDIS_JOBS_PREFIX}idempotency:{_digest(tenant_id, key)}"


def _digest(tenant_id: str, key: str) -> str:
    return hashlib.sha256(f"{tenant_id}\0{key}".encode()).hexdigest()


# --- HTTP headers ---
HTTP_REQUEST_ID: Final = "x-request-id"
HTTP_TIMEOUT_MS: Final = "x-llmq-timeout-ms"
HTTP_TRAFFIC_CLASS: Final = "x-llmq-class"
# OpenAI's and Anthropic's Python SDKs send their read timeout (seconds, e.g. "600.0"): a non-streamed request's deadline
HTTP_SDK_READ_TIMEOUT: Final = "x-stainless-read-timeout"
HTTP_IDEMPOTENCY_KEY: Final = "idempotency-key"
HTTP_LAST_EVENT_ID: Final = "last-event-id"  # SSE: the id of the last event a client resuming a stream got
HTTP_RETRY_AFTER: Final = "retry-after"
HTTP_PREDICTED_WAIT_MS: Final = "x-llmq-predicted-wait-ms"  # admission's predicted queue wait of an admitted request
HTTP_SHOULD_RETRY: Final = "x-should-retry"  # on every error response: whether a retry can help (OpenAI SDKs obey it)
HTTP_IDEMPOTENT_REPLAYED: Final = "idempotent-replayed"  # response header of a retry answered by an earlier request
HTTP_ANTHROPIC_VERSION: Final = "anthropic-version"  # Anthropic's API version header: marks an Anthropic caller
HTTP_ANTHROPIC_REQUEST_ID: Final = "request-id"  # Anthropic's request id header (its SDK reads this one)
HTTP_API_KEY: Final = "x-api-key"  # Anthropic's API key header (Authorization: Bearer works too)

# The wire format a caller speaks (wire.GenerationRequest.api_format): how its responses and stored result look.
OPENAI: Final = "openai"
ANTHROPIC: Final = "anthropic"
API_FORMATS: Final = (OPENAI, ANTHROPIC)
# What a Kafka reply record holds (wire.KafkaReply.body): the FinalResult, or the result line of the request's api_format.
REPLY_BODY_RESULT: Final = "result"
REPLY_BODY_API: Final = "api"
REPLY_BODIES: Final = (REPLY_BODY_RESULT, REPLY_BODY_API)

# --- request limits ---
MAX_LOGIT_BIAS_TOKENS: Final = 300  # entries of one request's logit_bias, as OpenAI allows
MAX_TOP_LOGPROBS: Final = (
    20  # alternatives per token of SamplingParams.logprobs (chat's top_logprobs), as OpenAI allows
)
MAX_COMPLETION_LOGPROBS: Final = 5  # /v1/completions' logprobs, as OpenAI's legacy completions allow

# --- resource bounds (docs/limits.md): one place, so the API's checks, the workers' caps and the topics agree ---
MAX_RESULT_BYTES: Final = 1 << 20  # UTF-8 bytes of all choices' text of one result; workers stop generating there
# JSON bytes of all choices' logprob entries of one result (wire.TokenLogprob); workers stop generating there (about
# 3,800 word tokens with 20 alternatives each), so text, logprobs and envelope still fit one record (also as JSON)
MAX_LOGPROBS_BYTES: Final = 6 << 20
RECORD_HEADROOM_BYTES: Final = 64 << 10  # a record's envelope beyond its payload (ids, usage, timings, error, headers)
# Kafka max.message.bytes of every llmq topic and max_request_size of every producer: a request body of the largest
# allowed size (see Settings.api.max_body_bytes) or a result of MAX_RESULT_BYTES, each with headroom, fits in one record.
KAFKA_MAX_MESSAGE_BYTES: Final = 8 << 20

# A model no worker heartbeat announced for this long is no longer accepted (built-in and configured models always are):
# the API pods' catalogue and the batcher's checks of requests from Kafka agree on it.
SEEN_MODEL_TTL_MS: Final = 60_000

# Structured outputs (wire.Structured.kind): constrained decoding of a response_format or a tool_choice.
JSON_OBJECT: Final = "json_object"
JSON_SCHEMA: Final = "json_schema"
TOOL: Final = "tool"
STRUCTURED_KINDS: Final = (JSON_OBJECT, JSON_SCHEMA, TOOL)
# OpenAI's tool_choice (wire.GenerationRequest.tool_choice): a named function travels as "function" + Structured.name.
TOOL_CHOICE_NONE: Final = "none"
TOOL_CHOICE_AUTO: Final = "auto"
TOOL_CHOICE_REQUIRED: Final = "required"
TOOL_CHOICE_FUNCTION: Final = "function"
TOOL_CHOICES: Final = (TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_FUNCTION)

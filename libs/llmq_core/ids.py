"""Identifiers that say where they were born: every instance, request, batch and batch-job id carries the region
(``Settings.region.name``), so ids stay unique across regions and a reader of a mirrored record knows its origin.

Every builder lives here so that services and batch jobs build them alike.
"""

from __future__ import annotations

import re
import uuid

# A region names a Kafka cluster alias of MirrorMaker 2 and prefixes topics, ids and keys: short, lower-case, no dots
REGION_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
DEFAULT_REGION = "local"


def check_region(region: str) -> str:
    """``region`` when it is a valid region name, else ValueError."""
    if not REGION_RE.fullmatch(region):
        raise ValueError(f"region {region!r} must be 1-32 characters of a-z 0-9 and '-', not starting or ending in '-'")
    return region


def instance_id(region: str, name: str) -> str:
    """A process's id in ``region``: ``<region>-<name>`` (``name`` as given when it already starts so)."""
    return name if name.startswith(f"{region}-") else f"{region}-{name}"


def request_id(region: str, prefix: str) -> str:
    """A new HTTP request's id, e.g. ``chatcmpl-<region>-<32 hex>``."""
    return f"{prefix}-{region}-{uuid.uuid4().hex}"


def batch_id_prefix(instance: str) -> str:
    """Prefix of a batcher's batch ids (``<prefix>-<n>``): its region-qualified instance id and a random suffix, so
    ids stay unique across the batcher's restarts (workers report them back as last_batch_id)."""
    return f"{instance}-{uuid.uuid4().hex[:6]}"


def batch_job_id(region: str) -> str:
    """A new batch job's id (``/v1/batches``), e.g. ``batch_<region>-<32 hex>``."""
    return f"batch_{region}-{uuid.uuid4().hex}"


_BATCH_JOB_ID_RE = re.compile(rf"batch_({REGION_RE.pattern})-[0-9a-f]{{32}}")


def batch_job_region(batch_id: str) -> str | None:
    """The region that created the batch job ``batch_id`` (:func:`batch_job_id`); None for an id of no such shape."""
    match = _BATCH_JOB_ID_RE.fullmatch(batch_id)
    return match[1] if match else None


def file_id(region: str) -> str:
    """A new file's id (``/v1/files``, output and error files), e.g. ``file-<region>-<32 hex>``."""
    return f"file-{region}-{uuid.uuid4().hex}"


# A Kafka-direct producer picks its own request ids; llmq scopes each by its tenant, so ids of different tenants never
# collide (claims, stored results, the batcher's queue) and a reuse is only ever seen by the tenant that reused it.
# HTTP ids (``<prefix>-<region>-...``) and batch-job line ids (``batch_...``) never start with this prefix.
TENANT_SCOPE_PREFIX = "kafka:"
TENANT_SCOPE_SEPARATOR = ":"  # so a tenant id that scopes Kafka-direct ids must not hold it


def tenant_scoped_id(tenant_id: str, request_id: str) -> str:
    """The id llmq runs a Kafka-direct request under: ``kafka:<tenant_id>:<request_id>``. ValueError for a tenant id
    holding ``:`` (two tenants' ids could then collide)."""
    if TENANT_SCOPE_SEPARATOR in tenant_id:
        raise ValueError(f"tenant_id {tenant_id[:40]!r} must not contain {TENANT_SCOPE_SEPARATOR!r}")
    return f"{TENANT_SCOPE_PREFIX}{tenant_id}{TENANT_SCOPE_SEPARATOR}{request_id}"


def producer_request_id(request_id: str) -> str:
    """The id a Kafka-direct producer gave the request llmq runs as ``request_id`` (the inverse of
    :func:`tenant_scoped_id`); any other id as it is."""
    if not request_id.startswith(TENANT_SCOPE_PREFIX):
        return request_id
    _, separator, own = request_id.removeprefix(TENANT_SCOPE_PREFIX).partition(TENANT_SCOPE_SEPARATOR)
    return own if separator else request_id

"""Who is calling: ``Authorization: Bearer <key>`` -> a :class:`Principal` (tenant, tier, allowed classes, limits).

Keys come from a YAML or JSON file named by ``settings.api_keys_file`` (shape: ``deploy/keys.example.yaml``) plus, when
``settings.api_dev_keys`` is on, the built-in dev keys. Keys are looked up by their SHA-256, so a file may list either
the key itself (``key``) or only its digest (``key_sha256``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from llmq_api.errors import ApiError
from llmq_api.validation import parse_traffic_class
from llmq_core import wire
from llmq_core.constants import HTTP_TRAFFIC_CLASS, TIER_FREE, TIER_PAID, TRAFFIC_CLASSES
from llmq_core.labels import DEV_FREE_TENANT, DEV_TENANT
from llmq_core.settings import Settings
from llmq_core.status import ErrorCode, ErrorType

DEV_KEY = "llmq-dev-key"
DEV_FREE_KEY = "llmq-dev-free-key"
PerMinute = Annotated[int, msgspec.Meta(ge=0)]
Quota = Annotated[int, msgspec.Meta(ge=0)]
Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-fA-F]{64}$")]


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """A caller: ``classes`` it may use (the first is its default), and limits per minute (0: unlimited); its batch
    quota (0: 1440 x ``tokens_per_min``) and file storage quota (0: the ``files_tenant_max_bytes`` setting)."""

    tenant_id: str
    tier: wire.Tier = TIER_PAID
    classes: tuple[str, ...] = TRAFFIC_CLASSES
    requests_per_min: int = 0
    tokens_per_min: int = 0
    batch_tokens_per_day: int = 0
    file_storage_bytes: int = 0

    def pick_class(self, header: str | None) -> str:
        """The traffic class from the ``x-llmq-class`` header value (absent: this caller's default class).

        Raises ApiError 400 for an unknown class, 403 for a class this caller may not use.
        """
        if header is None:
            return self.classes[0]
        traffic_class = parse_traffic_class(header)
        if traffic_class not in self.classes:
            raise ApiError(
                403,
                f"This API key may not use the {traffic_class} class (allowed: {', '.join(self.classes)})",
                type=ErrorType.PERMISSION,
                param=HTTP_TRAFFIC_CLASS,
                code=ErrorCode.CLASS_NOT_ALLOWED,
            )
        return traffic_class

    def at_tier(self, tier: wire.Tier | None) -> Principal:
        """This caller at ``tier`` when that is below its own (a paid key asking for ``free``); never above it."""
        if tier is None or tier == self.tier or self.tier == TIER_FREE:
            return self
        return msgspec.structs.replace(self, tier=tier)


DEV_KEYS = {
    DEV_KEY: Principal(tenant_id=DEV_TENANT),
    DEV_FREE_KEY: Principal(tenant_id=DEV_FREE_TENANT, tier=TIER_FREE),
}


class KeyEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of the keys file; exactly one of ``key`` / ``key_sha256`` (hex)."""

    tenant: str
    key: str | None = None
    key_sha256: Sha256Hex | None = None
    tier: wire.Tier = TIER_PAID
    classes: list[wire.TrafficClass] = msgspec.field(default_factory=lambda: list(TRAFFIC_CLASSES))
    requests_per_min: PerMinute = 0
    tokens_per_min: PerMinute = 0
    batch_tokens_per_day: Quota = 0
    file_storage_bytes: Quota = 0


class KeysFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    keys: list[KeyEntry] = []


class KeyStore:
    """SHA-256 of an API key -> its Principal; :meth:`authenticate` raises 401 ``invalid_api_key`` for anyone else."""

    def __init__(self, principals: dict[str, Principal], limit_share: float = 1.0) -> None:
        """``limit_share``: the share of each keys-file entry's global limits this region enforces."""
        self._limit_share = limit_share
        self._by_digest = {_digest(key): principal for key, principal in principals.items()}
        self._source = dict.fromkeys(
            self._by_digest, "the keys it started with (the dev keys, while LLMQ_API_DEV_KEYS is on)"
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyStore:
        """Dev keys (if ``api_dev_keys``) plus the ``api_keys_file`` entries. Raises ValueError for a bad file."""
        store = cls(DEV_KEYS if settings.api.dev_keys else {}, settings.region.limit_share)
        if settings.api.keys_file:
            store.add(load_keys_file(Path(settings.api.keys_file)), source=settings.api.keys_file)
        return store

    def add(self, entries: Iterable[KeyEntry], source: str = "keys") -> None:
        """Add ``entries`` (from ``source``, for errors). Raises ValueError for a key named twice (by its digest: a
        ``key`` and a ``key_sha256`` of it are the same key): which entry should win is not ours to guess."""
        for i, entry in enumerate(entries):
            digest = entry.key_sha256.lower() if entry.key_sha256 else _digest(entry.key or "")
            if digest in self._by_digest:
                raise ValueError(
                    f"API keys file {source}: keys[{i}] (tenant {entry.tenant!r}) names a key already given by"
                    f" {self._source[digest]} (same SHA-256 {digest[:12]}...); each key may appear once"
                )
            self._by_digest[digest] = _principal(entry, self._limit_share)
            self._source[digest] = f"keys[{i}] (tenant {entry.tenant!r})"

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of a valid ``Authorization`` header value; None for anyone else (never raises)."""
        try:
            return self.authenticate(authorization).tenant_id
        except ApiError:
            return None

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an ``Authorization`` header value (``Bearer <key>``)."""
        scheme, _, key = (authorization or "").strip().partition(" ")
        principal = self._by_digest.get(_digest(key.strip())) if scheme.lower() == "bearer" and key.strip() else None
        if principal is None:
            message = "Incorrect API key provided" if authorization else "You didn't provide an API key"
            raise ApiError(
                401,
                f"{message}; send 'Authorization: Bearer <key>'",
                type=ErrorType.INVALID_REQUEST,  # OpenAI's type for 401 invalid_api_key
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        return principal


def load_keys_file(path: Path) -> list[KeyEntry]:
    """Parse a keys file (YAML, which includes JSON). Raises ValueError naming the file and the problem."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
        entries = msgspec.convert(data, KeysFile).keys
    except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ValueError(f"API keys file {path}: {exc}") from exc
    for i, entry in enumerate(entries):
        if (entry.key is None) == (entry.key_sha256 is None) or not (entry.classes and entry.tenant):
            raise ValueError(
                f"API keys file {path}: keys[{i}] needs a tenant, at least one class and exactly one "
                "of key / key_sha256"
            )
    return entries


def regional_limit(global_limit: int, share: float) -> int:
    """This region's part of a tenant's global limit (0: unlimited stays unlimited): ``share`` of it, rounded down,
    never below 1 (a tenant with a limit can always send something)."""
    return max(1, math.floor(global_limit * share)) if global_limit else 0


def _principal(entry: KeyEntry, limit_share: float = 1.0) -> Principal:
    classes = tuple(sorted(set(entry.classes), key=TRAFFIC_CLASSES.index))
    return Principal(
        tenant_id=entry.tenant,
        tier=entry.tier,
        classes=classes,
        requests_per_min=regional_limit(entry.requests_per_min, limit_share),
        tokens_per_min=regional_limit(entry.tokens_per_min, limit_share),
        batch_tokens_per_day=regional_limit(entry.batch_tokens_per_day, limit_share),
        file_storage_bytes=entry.file_storage_bytes,
    )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()

"""Metric label values that a client or a Kafka producer cannot invent.

Every label value that comes from a request (model, tenant) passes through a :class:`LabelSet` first: a name outside
the model catalogue (``BUILTIN_MODELS`` plus ``settings.extra_models``) or the configured tenants (the API keys file's
tenants, and the dev tenants while ``settings.api_dev_keys`` is on) becomes :data:`OTHER`, so one producer with many
made-up names cannot grow any service's /metrics. Services other than the API learn the tenants from the same
``LLMQ_API_KEYS_FILE`` the API pods read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmq_core.ids import DEFAULT_REGION
from llmq_core.models import BUILTIN_MODELS
from llmq_core.settings import Settings

OTHER = "other"
DEV_TENANT = "dev"  # tenant of the built-in llmq-dev-key
DEV_FREE_TENANT = "dev-free"  # tenant of the built-in llmq-dev-free-key


@dataclass(frozen=True, slots=True)
class LabelSet:
    """The model and tenant names metrics may carry; anything else is :data:`OTHER`. ``region``: the ``region`` label
    of every metric (one value a process)."""

    models: frozenset[str] = frozenset(BUILTIN_MODELS)
    tenants: frozenset[str] = frozenset()
    region: str = DEFAULT_REGION

    @classmethod
    def from_settings(cls, settings: Settings) -> LabelSet:
        """The catalogue and configured tenants. Raises ValueError when the keys file cannot be read."""
        return cls(
            models=frozenset(BUILTIN_MODELS) | set(settings.models.extra),
            tenants=frozenset(configured_tenants(settings)),
            region=settings.region.name,
        )

    def model(self, name: str) -> str:
        return name if name in self.models else OTHER

    def tenant(self, name: str) -> str:
        return name if name in self.tenants else OTHER


def configured_tenants(settings: Settings) -> set[str]:
    """Tenant ids of the API keys file (``settings.api_keys_file``), plus the dev tenants when dev keys are on."""
    tenants = {DEV_TENANT, DEV_FREE_TENANT} if settings.api.dev_keys else set()
    if settings.api.keys_file:
        tenants.update(_file_tenants(Path(settings.api.keys_file)))
    return tenants


def _file_tenants(path: Path) -> Iterable[str]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"API keys file {path}: {exc}") from exc
    entries = data.get("keys") if isinstance(data, dict) else None
    return [e["tenant"] for e in entries or () if isinstance(e, dict) and isinstance(e.get("tenant"), str)]

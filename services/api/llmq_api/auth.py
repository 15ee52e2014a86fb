"""Who is calling: the ``Authorization`` header -> tenant and tier.

For now every caller (any Bearer key, or none) is tenant ``default`` on tier ``paid``. A key -> tenant map plugs in as
another :class:`Authenticator` that raises a 401 :class:`ApiError` for unknown keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmq_core.constants import TIER_PAID


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    tier: str


class Authenticator(Protocol):
    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an ``Authorization`` header value; raises ApiError(401) when it is refused."""
        ...


DEFAULT_PRINCIPAL = Principal(tenant_id="default", tier=TIER_PAID)


class AcceptAnyKey:
    """Accepts every caller as :data:`DEFAULT_PRINCIPAL` until real keys exist."""

    def authenticate(self, authorization: str | None) -> Principal:
        return DEFAULT_PRINCIPAL

"""Models this pod accepts: the built-in ones plus any model a worker heartbeat announced recently."""

from __future__ import annotations

from collections.abc import Mapping

from llmq_core import constants, wire
from llmq_core.clock import Clock
from llmq_core.models import BUILTIN_MODELS

SEEN_MODEL_TTL_MS = constants.SEEN_MODEL_TTL_MS  # a model no worker announced for this long is forgotten


class ModelCatalog:
    """Model name -> context window (tokens; 0 when a worker did not say). Times come from the injected clock."""

    def __init__(self, clock: Clock, seen_ttl_ms: int = SEEN_MODEL_TTL_MS) -> None:
        self._clock = clock
        self._seen_ttl_ms = seen_ttl_ms
        self._seen: dict[str, tuple[int, int]] = {}  # name -> (context_window, last_seen_ms)

    def observe(self, heartbeat: wire.WorkerHeartbeat) -> None:
        """Learn (or refresh) the heartbeat's model."""
        if heartbeat.model:
            self._seen[heartbeat.model] = (heartbeat.context_window, self._clock.now_ms())

    def heard_ms(self) -> dict[str, int]:
        """Model -> when this pod last heard a heartbeat of one of its workers (epoch ms)."""
        return {name: seen_ms for name, (_, seen_ms) in self._seen.items()}

    def context_windows(self) -> Mapping[str, int]:
        """Every model served now -> its context window; built-ins keep their own spec's window."""
        now_ms = self._clock.now_ms()
        windows = {
            name: window for name, (window, seen_ms) in self._seen.items() if now_ms - seen_ms <= self._seen_ttl_ms
        }
        windows.update({name: spec.context_window for name, spec in BUILTIN_MODELS.items()})
        return windows

    def listing(self) -> list[dict]:
        """OpenAI ``/v1/models`` entries, sorted by id, each with its ``context_window``."""
        owners = {name: spec.owned_by for name, spec in BUILTIN_MODELS.items()}
        return [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": owners.get(name, "llmq"),
                "context_window": window or None,
            }
            for name, window in sorted(self.context_windows().items())
        ]

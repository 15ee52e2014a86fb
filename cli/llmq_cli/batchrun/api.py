"""The HTTP edge: an OpenAI-compatible batch API (``/v1/files``, ``/v1/batches``) through the ``openai`` SDK, and
llmq's ``GET /v1/limits`` when the target has it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx
import openai

from llmq_cli.batchrun.shard import ShardLimits

ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
FIND_SLACK_S = 120  # a batch created this long before its shard's submit was recorded still counts as its own


@dataclass(frozen=True, slots=True)
class BatchState:
    id: str
    status: str
    total: int = 0
    done: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: str = ""  # a failed batch's reasons

    @property
    def ended(self) -> bool:
        return self.status in ENDED


class BatchApi(Protocol):
    def limits(self) -> ShardLimits | None: ...
    def upload(self, name: str, data: bytes) -> str: ...
    def find_upload(self, name: str, size: int) -> str | None: ...
    def delete(self, file_id: str) -> bool: ...
    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str], key: str) -> BatchState: ...
    def find(self, metadata: dict[str, str], since_s: float) -> BatchState | None: ...
    def retrieve(self, batch_id: str) -> BatchState: ...
    def content(self, file_id: str) -> bytes: ...


def _state(batch) -> BatchState:
    counts = batch.request_counts
    errors = "; ".join(
        f"line {e.line}: {e.code}: {e.message}" if e.line else f"{e.code}: {e.message}"
        for e in (batch.errors.data if batch.errors and batch.errors.data else [])
    )
    return BatchState(
        batch.id,
        batch.status,
        counts.total if counts else 0,
        counts.completed + counts.failed if counts else 0,
        batch.output_file_id,
        batch.error_file_id,
        errors,
    )


def limits_of(batch: object) -> ShardLimits | None:
    """The ``batch`` object of llmq's ``/v1/limits`` as shard limits (``max_line_bytes`` None when it is missing);
    None when it is no object; raises KeyError, TypeError or ValueError for an object of another shape."""
    if not isinstance(batch, dict) or not batch:
        return None
    line_bytes = batch.get("max_line_bytes")
    return ShardLimits(
        int(batch["max_requests"]), int(batch["max_file_bytes"]), None if line_bytes is None else int(line_bytes)
    )


class OpenAIBatchApi:
    def __init__(self, base_url: str, api_key: str) -> None:
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=300)
        self._base_url, self._api_key = base_url.rstrip("/"), api_key

    def limits(self) -> ShardLimits | None:
        """llmq's ``GET /v1/limits``; None when the target has no such route (then OpenAI's limits apply)."""
        try:
            response = httpx.get(
                f"{self._base_url}/limits", headers={"authorization": f"Bearer {self._api_key}"}, timeout=30
            )
            return limits_of(response.json()["batch"]) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def upload(self, name: str, data: bytes) -> str:
        return self._client.files.create(file=(name, data), purpose="batch").id

    def find_upload(self, name: str, size: int) -> str | None:
        """The id of the newest batch upload named ``name`` of ``size`` bytes, if the target holds one (an upload
        whose answer a kill lost)."""
        for file in self._client.files.list(purpose="batch"):
            if file.filename == name and file.bytes == size:
                return file.id
        return None

    def delete(self, file_id: str) -> bool:
        """``DELETE /v1/files/{id}``: True when the file is gone (deleted now, or before), False when the target
        refused (the caller tries again on a later run)."""
        try:
            self._client.files.delete(file_id)
        except openai.NotFoundError:
            return True
        except openai.APIError:
            return False
        return True

    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str], key: str) -> BatchState:
        """``key`` goes out as ``Idempotency-Key``: a create repeated after a lost answer returns the first batch
        where the target honours it (llmq does); ``find`` covers targets that do not."""
        batch = self._client.batches.create(
            input_file_id=file_id,
            endpoint=endpoint,
            completion_window=window,
            metadata=metadata,
            extra_headers={"Idempotency-Key": key},
        )
        return _state(batch)

    def find(self, metadata: dict[str, str], since_s: float) -> BatchState | None:
        """The newest batch carrying ``metadata`` created since ``since_s`` (epoch s, less a slack), if any."""
        for batch in self._client.batches.list(limit=100):
            if batch.created_at < since_s - FIND_SLACK_S:
                return None
            if all((batch.metadata or {}).get(k) == v for k, v in metadata.items()):
                return _state(batch)
        return None

    def retrieve(self, batch_id: str) -> BatchState:
        return _state(self._client.batches.retrieve(batch_id))

    def content(self, file_id: str) -> bytes:
        return self._client.files.content(file_id).read()

"""The HTTP edge for ``llmq batch run --format anthropic``: Anthropic's Message Batches (``/v1/messages/batches``)
through the ``anthropic`` SDK, behind the same :class:`~llmq_cli.batchrun.api.BatchApi` as OpenAI's batches.

Message Batches take their requests in the create body, not as an uploaded file: a shard's file is kept in the run's
state folder (``upload`` writes it there, ``create`` sends its lines as ``{custom_id, params: body}``, ``delete``
removes it), so a run resumed after a stop still has it. A batch carries no metadata, so ``find`` finds nothing: a
create whose answer was lost runs again. A shard's results are its "output file" (the batch id): one Anthropic
result line per request, sorted by :func:`llmq_cli.batchrun.outcomes.classify`.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from llmq_cli.batchrun.api import BatchState
from llmq_cli.batchrun.shard import ShardLimits

ANTHROPIC_VERSION = "2023-06-01"
MESSAGES_ENDPOINT = "/v1/messages"
_STATUS = {"in_progress": "in_progress", "canceling": "cancelling", "ended": "completed"}  # as BatchState reads them


class AnthropicBatchApi:
    def __init__(self, base_url: str, api_key: str, staging: Path) -> None:
        import anthropic  # only a run in this format pays for importing it

        self._root = base_url.rstrip("/").removesuffix("/v1")
        self._client = anthropic.Anthropic(base_url=self._root, api_key=api_key, max_retries=5, timeout=300)
        self._headers = {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}
        self._staging = staging

    def limits(self) -> ShardLimits | None:
        """llmq's ``GET /v1/limits`` ``message_batch`` object; None when the target has none (Anthropic's own
        limits then: 100,000 requests, 256 MB)."""
        try:
            response = httpx.get(f"{self._root}/v1/limits", headers=self._headers, timeout=30)
            limits = response.json()["message_batch"] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            limits = None
        if not isinstance(limits, dict):
            return ShardLimits(100_000, 256 * 1024 * 1024)
        return ShardLimits(int(limits["max_requests"]), int(limits["max_body_bytes"]), int(limits["max_request_bytes"]))

    def upload(self, name: str, data: bytes) -> str:
        self._staging.mkdir(parents=True, exist_ok=True)
        (self._staging / name).write_bytes(data)
        return name

    def find_upload(self, name: str, size: int) -> str | None:
        """None: an upload here only writes the staging folder, so doing it again leaves nothing behind."""
        return None

    def delete(self, file_id: str) -> bool:
        (self._staging / file_id).unlink(missing_ok=True)
        return True

    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str], key: str) -> BatchState:
        """The shard's lines as one Message Batch (``window``, ``metadata`` and ``key`` have no place in it: the
        target's ``expires_at`` bounds it)."""
        if endpoint != MESSAGES_ENDPOINT:
            raise ValueError(f"--format anthropic runs {MESSAGES_ENDPOINT} requests; the job's url is {endpoint}")
        lines = (json.loads(raw) for raw in (self._staging / file_id).read_bytes().splitlines() if raw.strip())
        requests = [{"custom_id": line["custom_id"], "params": line["body"]} for line in lines]
        return _state(self._client.messages.batches.create(requests=requests))

    def find(self, metadata: dict[str, str], since_s: float) -> BatchState | None:
        return None

    def retrieve(self, batch_id: str) -> BatchState:
        return _state(self._client.messages.batches.retrieve(batch_id))

    def content(self, file_id: str) -> bytes:
        """The batch's results (JSONL), as the target sent them."""
        response = httpx.get(f"{self._root}/v1/messages/batches/{file_id}/results", headers=self._headers, timeout=300)
        response.raise_for_status()
        return response.content


def _state(batch) -> BatchState:
    counts = batch.request_counts
    total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
    status = _STATUS.get(batch.processing_status, batch.processing_status)
    ended = batch.processing_status == "ended"
    return BatchState(batch.id, status, total, total - counts.processing, batch.id if ended else None, None)

"""An in-memory OpenAI-compatible batch API for the pipeline's unit tests: every batch ends at its first poll, each
line answered by ``answer(custom_id, attempt)`` (attempt counts from 0 per id)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

from llmq_cli.batchrun.api import BatchState
from llmq_cli.batchrun.shard import ShardLimits


def ok(text: str) -> dict:
    body = {"choices": [{"message": {"content": text}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    return {"response": {"status_code": 200, "body": body}, "error": None}


def failed(status: int, code: str) -> dict:
    return {"response": {"status_code": status, "body": {"error": {"code": code, "message": code}}}, "error": None}


def ended(code: str) -> dict:
    return {"response": None, "error": {"code": code, "message": code}}


Answer = Callable[[str, int], dict | None]  # None: the line is left out of both files


class FakeBatchApi:
    def __init__(self, answer: Answer = lambda cid, attempt: ok("{}"), limits: ShardLimits | None = None) -> None:
        self.answer = answer
        self._limits = limits
        self.files: dict[str, bytes] = {}
        self.names: dict[str, str] = {}  # file id -> the name it was uploaded as
        self.batches: dict[str, dict] = {}
        self.attempts: Counter[str] = Counter()
        self.downloads: Counter[str] = Counter()
        self.uploaded = 0
        self.upload_log: list[bytes] = []  # every upload's bytes, deleted or not
        self.creates = 0
        self.fail_next_create_after_sending = False
        self.deleted: list[str] = []
        self.refuse_deletes = False  # a target that answers DELETE /v1/files/{id} with an error

    def limits(self) -> ShardLimits | None:
        return self._limits

    def upload(self, name: str, data: bytes) -> str:
        self.uploaded += 1
        file_id = f"file-{self.uploaded}"
        self.files[file_id] = data
        self.names[file_id] = name
        self.upload_log.append(data)
        return file_id

    def find_upload(self, name: str, size: int) -> str | None:
        found = [f for f, data in self.uploads().items() if self.names[f] == name and len(data) == size]
        return found[-1] if found else None

    def delete(self, file_id: str) -> bool:
        if self.refuse_deletes:
            return False
        self.deleted.append(file_id)
        self.files.pop(file_id, None)
        return True

    def uploads(self) -> dict[str, bytes]:
        """The shard files uploaded and not deleted."""
        return {f: data for f, data in self.files.items() if f.startswith("file-")}

    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str], key: str) -> BatchState:
        self.creates += 1
        batch_id = f"batch-{len(self.batches)}"
        self.batches[batch_id] = {"file_id": file_id, "metadata": metadata, "created_at": 0.0, "polls": 0}
        if self.fail_next_create_after_sending:  # the answer is lost after the batch was made
            self.fail_next_create_after_sending = False
            raise KeyboardInterrupt
        return BatchState(batch_id, "validating")

    def find(self, metadata: dict[str, str], since_s: float) -> BatchState | None:
        for batch_id, batch in reversed(self.batches.items()):
            if batch["metadata"] == metadata:
                return BatchState(batch_id, "in_progress")
        return None

    def retrieve(self, batch_id: str) -> BatchState:
        batch = self.batches[batch_id]
        if "output" not in batch:
            out, errors = [], []
            for raw in self.files[batch["file_id"]].splitlines():
                cid = json.loads(raw)["custom_id"]
                line = self.answer(cid, self.attempts[cid])
                self.attempts[cid] += 1
                if line is not None:
                    full = {"id": f"r-{cid}", "custom_id": cid, **line}
                    ok_line = (line.get("response") or {}).get("status_code") == 200
                    (out if ok_line else errors).append(json.dumps(full))
            self.files[f"{batch_id}-out"] = "\n".join(out).encode()
            self.files[f"{batch_id}-err"] = "\n".join(errors).encode()
            batch["output"] = True
        return BatchState(batch_id, "completed", 0, 0, f"{batch_id}-out", f"{batch_id}-err")

    def content(self, file_id: str) -> bytes:
        self.downloads[file_id] += 1
        return self.files[file_id]

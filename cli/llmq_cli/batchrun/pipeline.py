"""The loop of ``llmq batch run``: plan a round's shards, upload and submit them (at most ``max_active_shards`` at a
time), poll them, collect each as soon as it ends, then plan the next round from the ids still missing. I/O goes
through the injected ``BatchApi``, clock and sleep; every step is recorded in the manifest before the next network
call, so a rerun after a kill at any point resumes: a shard is never submitted twice (its submit is marked before the
call and looked up by its metadata after a kill; the create also carries an Idempotency-Key) and a collected shard is
never downloaded again. A collected shard's upload is deleted from the target (it counts against the tenant's
storage), and a line too large for any upload is never uploaded: it fails alone, in round 0, not retried."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmq_cli.batchrun import outcomes
from llmq_cli.batchrun.api import BatchApi, BatchState
from llmq_cli.batchrun.jobfile import IdTemplate, Job, shard_file
from llmq_cli.batchrun.manifest import (
    COLLECTED,
    PLANNED,
    SUBMITTED,
    SUBMITTING,
    UPLOADED,
    UPLOADING,
    Manifest,
    Shard,
)
from llmq_cli.batchrun.shard import ShardLimits, plan, retry_limits, too_large


@dataclass(frozen=True, slots=True)
class RunConfig:
    window: str = "24h"
    max_rounds: int = 2
    limits: ShardLimits = ShardLimits(50_000, 200 * 1024 * 1024)
    max_active_shards: int = 8
    poll_interval_s: float = 10.0


class Display(Protocol):
    def shard(self, shard: Shard, state: BatchState | None) -> None: ...
    def overall(self, round_: int, accepted: int, total: int) -> None: ...


class NoDisplay:
    def shard(self, shard: Shard, state: BatchState | None) -> None: ...
    def overall(self, round_: int, accepted: int, total: int) -> None: ...


class Pipeline:
    def __init__(
        self,
        api: BatchApi,
        manifest: Manifest,
        job: Job,
        config: RunConfig,
        *,
        template: IdTemplate | None = None,
        validate: outcomes.Validator | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        display: Display | None = None,
    ) -> None:
        self.api, self.manifest, self.job, self.config = api, manifest, job, config
        self._template, self._validate = template, validate
        self._clock, self._sleep = clock, sleep
        self.display = display or NoDisplay()
        self._lines = {line.custom_id: line for line in job.lines}
        self.tag = manifest.put_default("tag", secrets.token_hex(8))  # names this job's files and batches

    def run(self) -> None:
        """Until the last round is collected and nothing is left to retry (or rounds ran out)."""
        self._delete_uploads()  # of shards an earlier run collected and was stopped before deleting
        if self.manifest.current_round() is None:
            self._plan(0, [line.custom_id for line in self.job.lines])
        while True:
            round_ = self.manifest.current_round()
            self._drive(round_)
            retry = self.manifest.retry_ids(round_)
            if not retry or round_ + 1 >= self.config.max_rounds:
                return
            self._plan(round_ + 1, [line.custom_id for line in self.job.lines if line.custom_id in retry])

    def _plan(self, round_: int, ids: list[str]) -> None:
        """The round's shards; in round 0, the lines no upload can hold are recorded as failed instead."""
        sizes = [(cid, self._lines[cid].upload_bytes) for cid in ids]
        refused = {cid: why for cid, size in sizes if (why := too_large(size, self.config.limits))}
        sizes = [(cid, size) for cid, size in sizes if cid not in refused]
        shards = plan(sizes, retry_limits(self.config.limits, round_))
        size_of = dict(sizes)
        self.manifest.add_shards(round_, [(shard, sum(size_of[cid] for cid in shard)) for shard in shards], refused)

    def _drive(self, round_: int) -> None:
        while True:
            pending = [s for s in self.manifest.shards(round_) if s.status != COLLECTED]
            if not pending:
                return
            active = sum(s.status in (SUBMITTING, SUBMITTED) for s in pending)
            for shard in pending:
                if shard.status == SUBMITTED:
                    self._poll(shard)
                elif shard.status == SUBMITTING:
                    self._submit(shard)
                elif active < self.config.max_active_shards:
                    self._start(shard)
                    active += 1
                else:
                    self.display.shard(shard, None)
            self.display.overall(round_, self.manifest.accepted_count(), len(self.job.lines))
            if any(s.status != COLLECTED for s in self.manifest.shards(round_)):
                self._sleep(self.config.poll_interval_s)

    def _start(self, shard: Shard) -> None:
        if shard.status in (PLANNED, UPLOADING):
            self._upload(shard)
            shard = self._reload(shard)
        if shard.status == UPLOADED:
            self.manifest.set_submitting(shard.number, self._clock())
            self._submit(self._reload(shard))

    def _upload(self, shard: Shard) -> None:
        """Upload the shard's file, unless an upload of an earlier run got through (found by its name and size)."""
        name = f"{self.tag}-shard-{shard.number}.jsonl"
        file_id = self.api.find_upload(name, shard.bytes) if shard.status == UPLOADING else None
        if file_id is None:
            data = shard_file(
                self.job, [self._lines[cid] for cid in self.manifest.shard_ids(shard.number)], self._template
            )
            if len(data) != shard.bytes:
                raise RuntimeError(
                    f"shard {shard.number}: the job file changed ({len(data)} bytes, planned {shard.bytes})"
                )
            self.manifest.set_uploading(shard.number)
            file_id = self.api.upload(name, data)
        self.manifest.set_uploaded(shard.number, file_id)

    def _submit(self, shard: Shard) -> None:
        """Create the shard's batch, unless a create of an earlier run got through (found by its metadata)."""
        metadata = {"llmq_batch_run": self.tag, "shard": str(shard.number)}
        found = self.api.find(metadata, shard.submitting_at or 0) if shard.status == SUBMITTING else None
        if found is None:
            key = f"llmq-batch-run-{self.tag}-{shard.number}"
            found = self.api.create(shard.file_id or "", self.job.endpoint, self.config.window, metadata, key)
        self.manifest.set_submitted(shard.number, found.id)
        self.display.shard(self._reload(shard), found)

    def _poll(self, shard: Shard) -> None:
        state = self.api.retrieve(shard.batch_id or "")
        if state.ended:
            self._collect(shard, state)
            shard = self._reload(shard)
        self.display.shard(shard, state)

    def _collect(self, shard: Shard, state: BatchState) -> None:
        """Download the shard's output and error files, sort every line, store it all in one transaction."""
        ids = set(self.manifest.shard_ids(shard.number))
        attempts: dict[str, outcomes.Attempt] = {}
        for file_id in (state.output_file_id, state.error_file_id):
            for raw in self.api.content(file_id).splitlines() if file_id else []:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                attempt = outcomes.classify(line, self._validate) if isinstance(line, dict) else None
                if attempt and attempt.custom_id in ids:
                    attempts[attempt.custom_id] = attempt
        why = f"{state.status} ({state.errors})" if state.errors else state.status
        for cid in ids - attempts.keys():
            attempts[cid] = outcomes.missing(cid, why)
        self.manifest.collect(shard, state.status, attempts.values(), self._clock())
        self._delete_upload(shard.number, shard.file_id or "")

    def _delete_uploads(self) -> None:
        for number, file_id in self.manifest.uploads_to_delete():
            self._delete_upload(number, file_id)

    def _delete_upload(self, number: int, file_id: str) -> None:
        """Delete a collected shard's upload from the target; one the target refuses now is tried again by the next
        run (the summary counts those left)."""
        if self.api.delete(file_id):
            self.manifest.set_upload_deleted(number)

    def _reload(self, shard: Shard) -> Shard:
        return next(s for s in self.manifest.shards(shard.round) if s.number == shard.number)

"""The manifest: a job's state in SQLite (standard library), so a killed run resumes where it stopped.

Tables: ``job`` (key/value: the job's digest, its tag, when it started), ``shards`` (one row per shard: number, round,
status, file id, batch id), ``shard_ids`` (the custom_ids each shard holds), ``results`` (one row per custom_id: its
accepted result, upserted so a late success replaces nothing twice) and ``failures`` (one row per custom_id and shard
that did not end accepted: outcome, code, message, whether it may be retried). Every step commits before the next
network call, in this order per shard: planned -> uploading -> uploaded (file id) -> submitting -> submitted (batch id)
-> collected (its results stored in the same transaction), and then its upload deleted from the target
(``deleted_uploads``). A shard found ``uploading`` or ``submitting`` may have reached the target before a kill: the
resumed run looks for its file or batch there before making another.
A line that can never be uploaded is a ``failures`` row of round 0 with shard :data:`NOT_UPLOADED`, written with the
first round's shards.

Private: the folder is made 0700 and the file 0600 (results are the tenant's data). :func:`open_manifest` is how a
run opens its manifest: created atomically with the job's digest, so a manifest without one (emptied, or not
llmq's) or a file that is not SQLite is refused instead of running the whole job again.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmq_cli.batchrun.outcomes import Attempt

PLANNED, UPLOADING, UPLOADED = "planned", "uploading", "uploaded"
SUBMITTING, SUBMITTED, COLLECTED = "submitting", "submitted", "collected"
NOT_UPLOADED = -1  # the shard of a failure that never reached the target (a line too large to upload)
LINE_TOO_LARGE = "line_too_large"  # its code (the one llmq's upload check gives such a line)
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700

SCHEMA = """
CREATE TABLE IF NOT EXISTS job (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shards (
    number INTEGER PRIMARY KEY, round INTEGER NOT NULL, status TEXT NOT NULL, requests INTEGER NOT NULL,
    bytes INTEGER NOT NULL, file_id TEXT, batch_id TEXT, submitting_at REAL, batch_status TEXT, ended_at REAL);
CREATE TABLE IF NOT EXISTS shard_ids (
    shard INTEGER NOT NULL, position INTEGER NOT NULL, custom_id TEXT NOT NULL, PRIMARY KEY (shard, position));
CREATE INDEX IF NOT EXISTS shard_ids_by_id ON shard_ids (custom_id);
CREATE TABLE IF NOT EXISTS results (
    custom_id TEXT PRIMARY KEY, shard INTEGER NOT NULL, round INTEGER NOT NULL, line TEXT NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS failures (
    custom_id TEXT NOT NULL, shard INTEGER NOT NULL, round INTEGER NOT NULL, outcome TEXT NOT NULL, code TEXT NOT NULL,
    message TEXT NOT NULL, retryable INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    PRIMARY KEY (custom_id, shard));
CREATE TABLE IF NOT EXISTS deleted_uploads (shard INTEGER PRIMARY KEY);
"""


class ManifestError(Exception):
    """The state folder's manifest cannot serve this job; the message says why and what to do."""


def open_manifest(path: Path, digest: str, *, restart: bool = False) -> Manifest:
    """The manifest of the job whose digest is ``digest``: created when there is none (``restart``: in place of the
    one there); raises ManifestError when the file is not a readable manifest, holds no job (emptied: going on
    would run and bill every line again) or another job's."""
    if restart or not path.exists():
        _create(path, digest)
    restart_hint = "pass --restart to run the whole job again (every line is billed again)"
    try:
        manifest = Manifest(path)
        found = manifest.get("digest")
    except sqlite3.DatabaseError as exc:
        raise ManifestError(f"{path} is not a readable manifest ({exc}): restore it, or {restart_hint}") from exc
    if found == digest:
        return manifest
    manifest.close()
    if found is None:
        raise ManifestError(f"{path} holds no job state (emptied?): restore it, or {restart_hint}")
    raise ManifestError(
        f"{path.parent} holds the state of another job (other file or --id-template): use another --state"
    )


def _create(path: Path, digest: str) -> None:
    """A new manifest holding ``digest`` in place of whatever ``path`` held (its -wal too: SQLite would apply it),
    made whole beside it and then moved there."""
    new = path.with_name(path.name + ".new")
    for stale in (new, *_sidecars(new), *_sidecars(path)):
        stale.unlink(missing_ok=True)
    manifest = Manifest(new)
    manifest.put_default("digest", digest)
    manifest.close()
    os.replace(new, path)


def _sidecars(path: Path) -> tuple[Path, ...]:
    return tuple(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))


@dataclass(frozen=True, slots=True)
class Shard:
    number: int
    round: int
    status: str
    requests: int
    bytes: int
    file_id: str | None
    batch_id: str | None
    submitting_at: float | None
    batch_status: str | None


class Manifest:
    def __init__(self, path: Path) -> None:
        """Open (or create) the manifest at ``path``, in a folder made 0700 when it is made here, the file 0600
        (SQLite gives its -wal and -shm files the same mode). Raises sqlite3.DatabaseError for a file that is not
        SQLite."""
        path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))
        os.chmod(path, PRIVATE_FILE)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- job ----------------------------------------------------------------------------------------------------------

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM job WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put_default(self, key: str, value: str) -> str:
        """``key``'s value, set to ``value`` unless it has one already."""
        self._db.execute("INSERT OR IGNORE INTO job (key, value) VALUES (?, ?)", (key, value))
        return self.get(key) or value

    # --- shards -------------------------------------------------------------------------------------------------------

    def add_shards(self, round_: int, shards: list[tuple[list[str], int]], refused: Mapping[str, str] = {}) -> None:
        """One transaction: every shard of a round with its ids (``(custom_ids, bytes)``), numbered after the last,
        and the lines ``refused`` (custom_id -> why) as failures that are not retried, never uploaded."""
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO failures VALUES (?, ?, ?, 'errored', ?, ?, 0, 0, 0)",
                ((cid, NOT_UPLOADED, round_, LINE_TOO_LARGE, why) for cid, why in refused.items()),
            )
            (last,) = db.execute("SELECT COALESCE(MAX(number), -1) FROM shards").fetchone()
            for number, (ids, size) in enumerate(shards, start=last + 1):
                db.execute(
                    "INSERT INTO shards (number, round, status, requests, bytes) VALUES (?, ?, ?, ?, ?)",
                    (number, round_, PLANNED, len(ids), size),
                )
                db.executemany(
                    "INSERT INTO shard_ids (shard, position, custom_id) VALUES (?, ?, ?)",
                    ((number, i, cid) for i, cid in enumerate(ids)),
                )

    def shards(self, round_: int | None = None) -> list[Shard]:
        where, args = ("WHERE round = ?", (round_,)) if round_ is not None else ("", ())
        rows = self._db.execute(
            "SELECT number, round, status, requests, bytes, file_id, batch_id, submitting_at, batch_status "
            f"FROM shards {where} ORDER BY number",
            args,
        )
        return [Shard(*row) for row in rows]

    def shard_ids(self, number: int) -> list[str]:
        rows = self._db.execute("SELECT custom_id FROM shard_ids WHERE shard = ? ORDER BY position", (number,))
        return [row[0] for row in rows]

    def current_round(self) -> int | None:
        (round_,) = self._db.execute("SELECT MAX(round) FROM shards").fetchone()
        return round_

    def set_uploading(self, number: int) -> None:
        self._db.execute("UPDATE shards SET status = ? WHERE number = ?", (UPLOADING, number))

    def set_uploaded(self, number: int, file_id: str) -> None:
        self._db.execute("UPDATE shards SET status = ?, file_id = ? WHERE number = ?", (UPLOADED, file_id, number))

    def set_submitting(self, number: int, at_s: float) -> None:
        self._db.execute("UPDATE shards SET status = ?, submitting_at = ? WHERE number = ?", (SUBMITTING, at_s, number))

    def set_submitted(self, number: int, batch_id: str) -> None:
        self._db.execute("UPDATE shards SET status = ?, batch_id = ? WHERE number = ?", (SUBMITTED, batch_id, number))

    def collect(self, shard: Shard, batch_status: str, attempts: Iterable[Attempt], at_s: float) -> None:
        """One transaction: the shard's attempts stored (accepted ones upserted into ``results``), the shard collected."""
        with self._tx() as db:
            for a in attempts:
                if a.accepted:
                    db.execute(
                        "INSERT INTO results (custom_id, shard, round, line, input_tokens, output_tokens) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (custom_id) DO UPDATE SET shard = excluded.shard, "
                        "round = excluded.round, line = excluded.line, input_tokens = excluded.input_tokens, "
                        "output_tokens = excluded.output_tokens",
                        (a.custom_id, shard.number, shard.round, a.line, a.input_tokens, a.output_tokens),
                    )
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO failures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            a.custom_id,
                            shard.number,
                            shard.round,
                            a.outcome,
                            a.code,
                            a.message,
                            int(a.retryable),
                            a.input_tokens,
                            a.output_tokens,
                        ),
                    )
            db.execute(
                "UPDATE shards SET status = ?, batch_status = ?, ended_at = ? WHERE number = ?",
                (COLLECTED, batch_status, at_s, shard.number),
            )

    def set_upload_deleted(self, number: int) -> None:
        self._db.execute("INSERT OR IGNORE INTO deleted_uploads (shard) VALUES (?)", (number,))

    def uploads_to_delete(self) -> list[tuple[int, str]]:
        """``(shard, file id)`` of every collected shard whose upload is still on the target."""
        rows = self._db.execute(
            "SELECT number, file_id FROM shards WHERE status = ? AND file_id IS NOT NULL "
            "AND number NOT IN (SELECT shard FROM deleted_uploads) ORDER BY number",
            (COLLECTED,),
        )
        return [(number, file_id) for number, file_id in rows]

    # --- results ------------------------------------------------------------------------------------------------------

    def retry_ids(self, round_: int) -> set[str]:
        """Ids of round ``round_`` with no accepted result whose failure in that round may be retried."""
        rows = self._db.execute(
            "SELECT custom_id FROM failures WHERE round = ? AND retryable = 1 "
            "AND custom_id NOT IN (SELECT custom_id FROM results)",
            (round_,),
        )
        return {row[0] for row in rows}

    def result_line(self, custom_id: str) -> str | None:
        row = self._db.execute("SELECT line FROM results WHERE custom_id = ?", (custom_id,)).fetchone()
        return row[0] if row else None

    def failures(self, custom_id: str) -> list[dict]:
        rows = self._db.execute(
            "SELECT round, shard, outcome, code, message, retryable FROM failures WHERE custom_id = ? "
            "ORDER BY round, shard",
            (custom_id,),
        )
        keys = ("round", "shard", "outcome", "code", "message", "retryable")
        return [{**dict(zip(keys, row)), "retryable": bool(row[5])} for row in rows]

    def outcome_counts(self) -> dict[int, dict[str, int]]:
        """Per round, how many attempts ended in each outcome (accepted results count as succeeded)."""
        counts: dict[int, dict[str, int]] = {}
        query = (
            "SELECT round, 'succeeded', COUNT(*) FROM results GROUP BY round "
            "UNION ALL SELECT round, outcome, COUNT(*) FROM failures GROUP BY round, outcome"
        )
        for round_, outcome, n in self._db.execute(query):
            counts.setdefault(round_, {})[outcome] = counts.setdefault(round_, {}).get(outcome, 0) + n
        return counts

    def tokens(self) -> tuple[int, int]:
        """Input and output tokens of every answer the target returned (billed, whether accepted or not)."""
        (i1, o1) = self._db.execute(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM results"
        ).fetchone()
        (i2, o2) = self._db.execute(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM failures"
        ).fetchone()
        return i1 + i2, o1 + o2

    def accepted_count(self) -> int:
        (n,) = self._db.execute("SELECT COUNT(*) FROM results").fetchone()
        return n

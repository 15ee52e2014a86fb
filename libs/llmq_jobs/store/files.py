"""File records in Redis: one key per file, its tenant's listing (newest first) and the expiry sweep's zset.
Key names: :mod:`llmq_core.constants` (``file_key``, ``tenant_files_key``, ``FILE_EXPIRY_KEY``)."""

from __future__ import annotations

import msgspec
from redis.asyncio import Redis

from llmq_core import constants
from llmq_jobs import jobs
from llmq_jobs.jobs import FileRecord

# KEYS: the file's record, the tenant's listing, the expiry zset, the tenant's storage counter. ARGV: listing member,
# file id, bytes. Forgets the file; its bytes leave the storage counter only if the record still existed (once).
_DELETE_FILE = """
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
if existed == 1 and tonumber(ARGV[3]) > 0 then redis.call('DECRBY', KEYS[4], ARGV[3]) end
return existed
"""


class FileIndex:
    """The file records (the bytes are in the :class:`~llmq_jobs.filestore.FileStore`). Methods raise redis errors
    as they come."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._delete_file = redis.register_script(_DELETE_FILE)

    async def put_file(self, record: FileRecord) -> None:
        """Store the record, list it for its tenant, and schedule its expiry sweep (when it expires)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            put_file_on(pipe, record)
            await pipe.execute()

    async def update_file(self, record: FileRecord) -> None:
        """Replace the record of a file that still exists (a deleted one stays deleted)."""
        await self.redis.set(constants.file_key(record.id), msgspec.json.encode(record), xx=True)

    async def reschedule(self, file_id: str, expires_at: int) -> None:
        """Move a file's expiry to epoch s ``expires_at`` (a file that is gone stays gone)."""
        record = await self.get_file(file_id)
        if record is None:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            moved = msgspec.structs.replace(record, expires_at=expires_at)
            pipe.set(constants.file_key(file_id), msgspec.json.encode(moved), xx=True)
            pipe.zadd(constants.FILE_EXPIRY_KEY, {file_id: expires_at})
            await pipe.execute()

    async def get_file(self, file_id: str) -> FileRecord | None:
        data = await self.redis.get(constants.file_key(file_id))
        return msgspec.json.decode(data, type=FileRecord) if data else None

    async def delete_file(self, record: FileRecord) -> None:
        """Forget the record (the caller deletes the stored object); an upload's bytes leave its tenant's storage."""
        stored = record.bytes if record.kind == "input" else 0
        keys = [
            constants.file_key(record.id),
            constants.tenant_files_key(record.tenant_id),
            constants.FILE_EXPIRY_KEY,
            constants.tenant_storage_key(record.tenant_id),
        ]
        await self._delete_file(keys=keys, args=[_file_member(record), record.id, stored])

    async def list_files(
        self, tenant_id: str, after: FileRecord | None, limit: int, purpose: str | None = None, ascending: bool = False
    ) -> tuple[list[FileRecord], bool]:
        """A tenant's files of ``purpose`` (None: any), newest first (``ascending``: oldest first), starting after
        ``after``; returns (at most ``limit`` files, has_more). Reads the listing a page at a time until ``limit`` of
        them match, so a page of other purposes (a job's output files) never hides older matches."""
        key = constants.tenant_files_key(tenant_id)
        start = None if after is None else "(" + _file_member(after)
        found: list[FileRecord] = []
        while len(found) <= limit:
            if ascending:
                members = await self.redis.zrangebylex(key, start or "-", "+", 0, limit + 1)
            else:
                members = await self.redis.zrevrangebylex(key, start or "+", "-", 0, limit + 1)
            if not members:
                break
            start = "(" + members[-1].decode()
            records = await self.redis.mget([constants.file_key(m.decode().split(":", 1)[1]) for m in members])
            decoded = (msgspec.json.decode(r, type=FileRecord) for r in records if r)
            found += [r for r in decoded if purpose is None or r.purpose == purpose]
            if len(members) <= limit:  # the listing's end
                break
        return found[:limit], len(found) > limit

    async def expired_files(self, now_s: int, limit: int = 100) -> list[str]:
        """Ids of files whose ``expires_at`` has passed."""
        return [m.decode() for m in await self.redis.zrangebyscore(constants.FILE_EXPIRY_KEY, 0, now_s, 0, limit)]


def put_file_on(pipe, record: FileRecord) -> None:
    """Queue on ``pipe`` the writes of :meth:`FileIndex.put_file` (a job's output files go in with the job)."""
    pipe.set(constants.file_key(record.id), msgspec.json.encode(record))
    pipe.zadd(constants.tenant_files_key(record.tenant_id), {_file_member(record): 0})
    if record.expires_at is not None:
        pipe.zadd(constants.FILE_EXPIRY_KEY, {record.id: record.expires_at})


def _file_member(record: FileRecord) -> str:
    return jobs.listing_member(record.created_at * 1000, record.id)

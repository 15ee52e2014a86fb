"""The file store behind ``/v1/files`` and batch jobs: objects under one root, on any fsspec filesystem.

``files_url`` is a local directory (default ``var/files``) or an fsspec URL (``s3://bucket/prefix``, ``memory://x``,
``gs://...``; the filesystem's package must be installed). Paths given to :class:`FileStore` are relative to that
root. fsspec calls block, so every method runs them in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import fsspec
from fsspec.core import url_to_fs

READ_CHUNK_BYTES = 1 << 20
PRIVATE_FILE_MODE = 0o600  # on a local disk: tenants' uploads and results are readable by the service's user only
PRIVATE_DIR_MODE = 0o700


class FileStore:
    """Async facade over one fsspec filesystem rooted at ``url``."""

    def __init__(self, url: str) -> None:
        self.fs: fsspec.AbstractFileSystem
        self.fs, root = url_to_fs(url)
        self.root = root.rstrip("/")
        self._local = "file" in self.fs.protocol

    def _makedirs(self, folder: str) -> None:
        """Create ``folder`` and its missing parents (on a local disk: PRIVATE_DIR_MODE)."""
        if not self._local:
            self.fs.makedirs(folder, exist_ok=True)
            return
        missing = [folder]
        while not os.path.isdir(parent := os.path.dirname(missing[-1])) and parent != missing[-1]:
            missing.append(parent)
        for path in reversed(missing):  # os.makedirs would give only the last one its mode
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, PRIVATE_DIR_MODE)

    def _open_for_write(self, full: str):
        """Open ``full`` to be written, its parents created; on a local disk PRIVATE_FILE_MODE before any byte."""
        parent = full.rsplit("/", 1)[0]
        if parent:
            self._makedirs(parent)
        handle = self.fs.open(full, "wb")
        if self._local:
            os.chmod(full, PRIVATE_FILE_MODE)
        return handle

    def _full(self, path: str) -> str:
        return f"{self.root}/{path.lstrip('/')}"

    async def write(self, path: str, chunks: Iterable[bytes]) -> int:
        """Write ``chunks`` as the object ``path`` (parents created); returns the bytes written."""
        return await asyncio.to_thread(self._write, self._full(path), chunks)

    def _write(self, full: str, chunks: Iterable[bytes]) -> int:
        size = 0
        with self._open_for_write(full) as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        return size

    @contextlib.asynccontextmanager
    async def writer(self, path: str) -> AsyncIterator[Callable[[bytes], Awaitable[int]]]:
        """Write the object ``path`` (parents created) piece by piece: yields an async ``write(data)``."""
        handle = await asyncio.to_thread(self._open_for_write, self._full(path))
        try:
            yield lambda data: asyncio.to_thread(handle.write, data)
        finally:
            await asyncio.to_thread(handle.close)

    async def read(self, path: str) -> bytes:
        """The whole object. Raises FileNotFoundError."""
        return await asyncio.to_thread(self.fs.cat_file, self._full(path))

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object. Raises FileNotFoundError."""
        return await asyncio.to_thread(self.fs.cat_file, self._full(path), start, end)

    async def iter_bytes(self, path: str, chunk_bytes: int = READ_CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The object in chunks of at most ``chunk_bytes``. Raises FileNotFoundError before the first chunk."""
        handle = await asyncio.to_thread(self.fs.open, self._full(path), "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, chunk_bytes):
                yield chunk
        finally:
            await asyncio.to_thread(handle.close)

    async def read_lines(self, path: str, start: int, max_lines: int) -> list[tuple[int, bytes]]:
        """Up to ``max_lines`` whole lines from byte ``start``: ``(offset after the line, line without b"\\n")``."""
        return await asyncio.to_thread(self._read_lines, self._full(path), start, max_lines)

    def _read_lines(self, full: str, start: int, max_lines: int) -> list[tuple[int, bytes]]:
        lines = []
        with self.fs.open(full, "rb") as handle:
            handle.seek(start)
            position = start
            while len(lines) < max_lines:
                line = handle.readline()
                if not line:
                    break
                position += len(line)
                lines.append((position, line.rstrip(b"\n")))
        return lines

    async def delete(self, path: str) -> None:
        """Remove the object; a missing one is fine."""
        await asyncio.to_thread(self._delete, self._full(path))

    def _delete(self, full: str) -> None:
        try:
            self.fs.rm_file(full)
        except FileNotFoundError:
            pass

    async def exists(self, path: str) -> bool:
        return await asyncio.to_thread(self.fs.exists, self._full(path))

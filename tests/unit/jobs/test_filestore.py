"""The fsspec file store: a local directory and an in-memory filesystem behave the same."""

import stat
import uuid

import pytest

from llmq_jobs.filestore import FileStore


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    return FileStore(str(tmp_path / "files") if request.param == "local" else f"memory://llmq-{uuid.uuid4().hex}")


async def test_write_read_ranges_lines_and_delete(store):
    size = await store.write("jobs/b1/requests.jsonl", [b"one\n", b"two\nthr", b"ee\n"])
    assert size == 14
    assert await store.read("jobs/b1/requests.jsonl") == b"one\ntwo\nthree\n"
    assert await store.read_range("jobs/b1/requests.jsonl", 4, 8) == b"two\n"
    assert await store.read_lines("jobs/b1/requests.jsonl", 4, 5) == [(8, b"two"), (14, b"three")]
    assert await store.read_lines("jobs/b1/requests.jsonl", 14, 5) == []
    assert (
        b"".join([c async for c in store.iter_bytes("jobs/b1/requests.jsonl", chunk_bytes=5)]) == b"one\ntwo\nthree\n"
    )
    await store.delete("jobs/b1/requests.jsonl")
    assert not await store.exists("jobs/b1/requests.jsonl")
    await store.delete("jobs/b1/requests.jsonl")  # missing: fine


async def test_missing_objects_raise_file_not_found(store):
    with pytest.raises(FileNotFoundError):
        await store.read("nope")


async def test_a_failing_writer_propagates(store):
    def chunks():
        yield b"part"
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        await store.write("broken", chunks())


async def test_local_objects_and_the_folders_created_for_them_are_private(tmp_path):
    store = FileStore(str(tmp_path / "files"))
    await store.write("tenant/in.jsonl", [b"a\n"])
    async with store.writer("tenant/out/results.jsonl") as write:
        await write(b"b\n")
    for path in (tmp_path / "files" / "tenant" / "in.jsonl", tmp_path / "files" / "tenant" / "out" / "results.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in (tmp_path / "files", tmp_path / "files" / "tenant", tmp_path / "files" / "tenant" / "out"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
